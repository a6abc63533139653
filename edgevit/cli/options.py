"""Option types several commands share, validated by click before a command
starts, so a bad value costs nothing and reads as one ``error:`` line."""
from __future__ import annotations

import functools
import math
import os

import click

from edgevit.errors import not_there

# Every registered model runs at 224-256 px by default and fine-tuning recipes
# go up to 384-512; at 1024 a ViT-B/16 already attends over 4096 tokens.
# Larger sizes only run out of memory after minutes (9984 px did, in the
# converter), so they are refused up front.
MAX_INPUT_SIZE = 1024


class InputSize(click.ParamType):
    """A square input size in pixels, at most MAX_INPUT_SIZE (whether it is
    positive and fits a model's patch grid is the registry's check, which
    suggests sizes that do)."""
    name = "PIXELS"

    def convert(self, value, param, ctx):
        try:
            size = int(value)
        except ValueError:
            self.fail(f"{value!r} is not a whole number of pixels", param, ctx)
        if size > MAX_INPUT_SIZE:
            self.fail(f"{size} px is above {MAX_INPUT_SIZE} px, the largest input edgevit builds (4x the largest "
                      "default size; larger inputs run out of memory while converting)", param, ctx)
        return size


class InputSizes(click.ParamType):
    """Comma-separated input sizes (multi-scale training), each an InputSize."""
    name = "SIZES"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        parts = [part.strip() for part in str(value).split(",") if part.strip()]
        if not parts:
            self.fail("give at least one size, e.g. 160,192,224", param, ctx)
        return sorted({InputSize().convert(part, param, ctx) for part in parts})


class Seconds(click.FloatRange):
    """A time in seconds, at least ``low`` (and at most ``high`` where
    given): a finite number (nan compares false with every bound, so a range
    alone takes it; inf never ends)."""
    name = "SECONDS"

    def __init__(self, low: float, high: float | None = None):
        super().__init__(low, high)

    def convert(self, value, param, ctx):
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


def leads_somewhere(ctx, param, value):
    """A path that is a symbolic link looping or leading nowhere, refused as
    such (it would otherwise read as a folder that does not exist)."""
    if value is not None and os.path.islink(value) and not os.path.exists(value):
        raise click.BadParameter(f"{value!r} {not_there(value)}", ctx, param)
    return value


def positive_learning_rate(ctx, param, value):
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"the learning rate must be a positive number, got {value}", ctx, param)
    return value


def classifier_classes(ctx, param, value):
    if value is not None and value < 2:
        raise click.BadParameter(f"a classifier needs at least 2 classes, got {value}", ctx, param)
    return value


def open_fraction(ctx, param, value):
    if value is not None and not 0.0 < value < 1.0:
        raise click.BadParameter(f"the held-out fraction must be between 0 and 1 (exclusive), got {value}",
                                 ctx, param)
    return value


PRECISION_FLAGS = [("fp32", "float32 weights and activations"),
                   ("fp16", "float16 weights, float32 compute"),
                   ("dynamic", "int8 weights, float activations (dynamic range)"),
                   ("int8", "full integer: int8 weights and activations, no float op (the default; the fewest "
                            "instructions on LiteRT's Arm64 CPU kernels)"),
                   ("int8-mixed", "int8 except attention matmuls, softmax and LayerNorm's 1/sqrt: one XNNPACK "
                                  "partition, the fastest on x86 CPUs with VNNI/AMX; on Arm64 kernels about 1.1x "
                                  "the instructions of --int8"),
                   ("int16x8", "int16 activations, int8 weights")]
DEFAULT_PRECISION = "int8"


def precision_options(fn):
    """One flag per precision, passed on as ``precision``; two different
    flags contradict each other and are refused rather than one winning."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        chosen = [flag for flag, _ in PRECISION_FLAGS if kwargs.pop(_param_name(flag))]
        if len(chosen) > 1:
            raise click.UsageError(f"{' and '.join('--' + flag for flag in chosen)} contradict each other: "
                                   "give one precision flag")
        precision = chosen[0] if chosen else DEFAULT_PRECISION
        return fn(*args, precision=precision.replace("-", "_"), **kwargs)

    for flag, help_text in reversed(PRECISION_FLAGS):
        wrapper = click.option(f"--{flag}", _param_name(flag), is_flag=True, help=help_text)(wrapper)
    return wrapper


def _param_name(flag: str) -> str:
    return "precision_" + flag.replace("-", "_")


# How `--weights imagenet` fetches, for every command's --weights help.
IMAGENET_DOWNLOAD = ("downloaded once from the Hugging Face Hub or the publisher's URL, verified and cached; "
                     "HF_ENDPOINT and EDGEVIT_WEIGHTS_MIRROR=URL point them to mirrors, `edgevit list --pretrained` "
                     "lists them")

OVERWRITE_HELP = ("Replace output files that already exist (without it an existing output is refused: it may have "
                  "been made from another model, precision or input).")


def overwrite_option(fn):
    return click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)(fn)
