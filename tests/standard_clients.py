"""The clients app developers load classifiers, segmenters and detectors
with, run on edgevit files: MediaPipe Tasks' ImageClassifier,
ImageSegmenter and ObjectDetector (pip mediapipe, in this environment) and
the TFLite Task Library's (pip tflite-support, in the virtual environment
scripts/install-test-tools.sh makes: it pins protobuf < 4). Each runs in a
child process on uint8 images (crops at the model's input size, so that
every client and LiteRT see the same pixels; or photos as a camera gives
them)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

CLIENTS = Path(__file__).resolve().parent / "clients"
TOOLS = Path(os.environ.get("EDGEVIT_TOOLS_PREFIX", Path.home() / ".cache" / "edgevit-test-tools"))
TASK_LIBRARY_PYTHON = TOOLS / "task-library" / "bin" / "python"


def missing(client: str) -> str | None:
    """Why ``client`` cannot run here (None: it can)."""
    if client == "mediapipe":
        return None if importlib.util.find_spec("mediapipe") else "pip mediapipe is not installed"
    if not TASK_LIBRARY_PYTHON.exists():
        return f"no Task Library environment at {TASK_LIBRARY_PYTHON} (scripts/install-test-tools.sh makes it)"
    return None


def classify(client: str, model: Path, pixels: np.ndarray, tmp: Path) -> list | str:
    """Per image, the client's top-5 [index, category name, score]; or the
    client's refusal message."""
    out = tmp / f"{client}-out.json"
    refusal = _run(client, "classify", model, pixels, tmp, out)
    return refusal if refusal is not None else json.loads(out.read_text())


def segment(client: str, model: Path, pixels: np.ndarray, tmp: Path) -> dict | str:
    """The client's category masks, confidence masks and labels of the
    images (tests/clients/*_segment.py say at which size); or the client's
    refusal message."""
    out = tmp / f"{client}-out.npz"
    refusal = _run(client, "segment", model, pixels, tmp, out)
    if refusal is not None:
        return refusal
    with np.load(out) as result:
        return {"category": result["category"], "confidence": result["confidence"],
                "labels": [str(label) for label in result["labels"]]}


def detect(client: str, model: Path, pixels: np.ndarray | list[np.ndarray], tmp: Path, score_threshold: float = 0.0,
           max_results: int = -1) -> list | str:
    """Per image (``pixels``: uint8 [N, H, W, 3], or a list of images of
    their own sizes), the client's detections [index, category name, score,
    ymin, xmin, ymax, xmax] (normalised), with the options an app sets (by
    default: all of them); or the client's refusal message."""
    out = tmp / f"{client}-out.json"
    refusal = _run(client, "detect", model, pixels, tmp, out, score_threshold, max_results)
    return refusal if refusal is not None else json.loads(out.read_text())


def embed(model: Path, pixels: list[np.ndarray], tmp: Path) -> np.ndarray | str:
    """MediaPipe's ImageEmbedder's embeddings [N, D] of the images (a list of
    their own sizes), unnormalised; or its refusal message."""
    out = tmp / "mediapipe-out.npy"
    refusal = _run("mediapipe", "embed", model, pixels, tmp, out)
    return refusal if refusal is not None else np.load(out)


def _run(client: str, task: str, model: Path, pixels: np.ndarray, tmp: Path, out: Path, *options) -> str | None:
    """Run the client's ``task`` script on ``pixels`` (uint8 images: one
    array, or a list of images of their own sizes) with its ``options``;
    its refusal message, or None."""
    python = sys.executable if client == "mediapipe" else str(TASK_LIBRARY_PYTHON)
    if isinstance(pixels, list):
        images = tmp / f"{client}-images.npz"
        np.savez(images, *(np.asarray(image, np.uint8) for image in pixels))
    else:
        images = tmp / f"{client}-images.npy"
        np.save(images, pixels.astype(np.uint8))
    proc = subprocess.run([python, str(CLIENTS / f"{client}_{task}.py"), str(model), str(images), str(out),
                           *map(str, options)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", GLOG_minloglevel="2"))
    if proc.returncode == 3:
        return proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 0, f"{client} failed on {model.name}: {proc.stderr[-2000:]}"
    return None
