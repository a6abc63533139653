"""Latency of MobileViT files per precision on this CPU (LiteRT, XNNPACK).

Converts each model to every requested precision (recording conversion wall
time), then times all files in one interleaved run: each round visits every
(file, threads) pair once, so drift in machine load hits all of them alike.
Reports medians and the ratio of each precision to the same model's fp32.

    python benchmarks/mobilevit_latency.py                       # the default set
    python benchmarks/mobilevit_latency.py --models mobilevit_v3_xxs --rounds 5 --json out.json
    python benchmarks/mobilevit_latency.py --models deeplabv3_mobilevit_v1_xxs --input-size 512 \
        --precisions fp32 int8 int8_mixed --threads 1 --arm a76 --pytorch-python pt/bin/python

The PyTorch route: MobileViT v1 models (from timm) and the DeepLabV3
segmenters on them (transformers' ``MobileViTForSemanticSegmentation``) and
the SSDLite detectors on them (ml-cvnets' ``SingleShotMaskDetector``, built
by the ml-cvnets checkout given with --cvnets: a folder with a ``build.py``
whose ``ssd(config, overrides)`` builds it from its COCO config) are
also exported with litert-torch and timed in the same run, where a Python
with torch, timm, transformers and litert-torch is at hand: this one, or
another given with --pytorch-python (a venv of its own keeps litert-torch's
dependencies apart: `python -m venv --system-site-packages pt &&
pt/bin/pip install litert-torch` reuses this environment's torch and
transformers). Three files per model (--pytorch-routes): litert-torch's
fp32 file, PT2E int8 (litert-torch's PT2EQuantizer, per-channel, calibrated
on the same images as edgevit's files) and ai-edge-quantizer's static int8
recipe applied to the fp32 file (AEQ). The export runs in a child process:
litert-torch's converter and TensorFlow's, after several conversions in one
process, crashed it (segmentation fault). Both routes' files compute the
same function: the twin gets random weights of a sensible scale (timm
zero-initialises the last BatchNorm of each residual block, and the
converter deletes such dead branches: a file with two MobileNetV2 blocks
fewer would be timed; a segmenter's logits are scaled to a trained one's
spread), edgevit imports exactly those weights, and the table reports the
two fp32 files' output cosine (``cosine_vs_edgevit_fp32``, per pixel for a
segmenter; for a detector the lower of its boxes' and its class scores' cosines, the
route's logits turned into edgevit's softmax scores without the background) and each
file's cosine to its own float model (``cosine_mean``: the Keras model for
edgevit's, the PyTorch module for the route's).

Every file, the PyTorch route's included, is also counted on the phone's
CPU kernels: exact instructions per inference on LiteRT 1.4's Arm64 build
under emulation (edgevit.profile.arm; `--arm a76,max` by default, the
Cortex-A76 dotprod and the i8mm kernels), where scripts/install-arm-emulator.sh
installed it. Instructions are not cycles: compare counts of one profile.

Targets (1 thread, ratio to the same model's fp32 file): --int8-mixed <= 0.45
for mobilevit_v1_xs and mobilevit_v3_xs, --int8 <= 0.35 for mobilevit_v3_100,
full --int8 <= 1.2; edgevit's fp32 mobilevit_v1_xs <= 0.9x the PyTorch
route's fp32 file. On the Arm64 counts (a76): the best int8 file of
mobilevit_v1_xs and mobilevit_v3_xs <= 0.30x its fp32 file's instructions
(issue 27's; out of reach on LiteRT 1.4's kernels: the GEMM, ruy matmul,
softmax, depthwise and SiLU kernels alone come to 0.32-0.33x, see
docs/profiling.md, so the run reports it as missed).
Int8 ratios mean something only on a CPU with int8 dot-product instructions
(AVX-512 VNNI, AVX-VNNI, AMX, Arm dotprod): the table title names this
CPU's (``host_description``); without them int8 GEMMs run about as fast as
fp32 ones.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT_MODELS = ["mobilevit_v3_xs", "mobilevit_v3_100", "mobilevit_v1_xs"]
DEFAULT_PRECISIONS = ["fp32", "int8", "int8_mixed"]
# (model, precision) -> the largest ratio to the model's own fp32 file, 1 thread
TARGETS = {("mobilevit_v1_xs", "int8_mixed"): 0.45, ("mobilevit_v3_xs", "int8_mixed"): 0.45,
           ("mobilevit_v3_100", "int8"): 0.35, ("mobilevit_v1_xs", "int8"): 1.2,
           ("mobilevit_v3_xs", "int8"): 1.2}
PYTORCH_ROUTE_TARGET = 0.9  # edgevit fp32 / PyTorch-route fp32, same architecture and weights
# model -> the largest ratio of its best int8 file's Arm64 instructions (a76 kernels) to its fp32 file's
ARM_TARGETS = {"mobilevit_v1_xs": 0.30, "mobilevit_v3_xs": 0.30}
ARM_TARGET_PROFILE = "a76"
# edgevit model -> (the source its PyTorch twin comes from, the twin's name there, the channel order it takes)
PYTORCH_TWINS = {**{f"mobilevit_v1_{w}": ("timm", f"mobilevit_{w}", "RGB") for w in ("xxs", "xs", "s")},
                 **{f"deeplabv3_mobilevit_v1_{w}": ("huggingface", f"deeplabv3_mobilevit_v1_{w}", "BGR")
                    for w in ("xxs", "xs", "s")},
                 **{f"ssdlite_mobilevit_v1_{w}": ("cvnets", mode, "BGR")
                    for w, mode in (("xxs", "xx_small"), ("xs", "x_small"), ("s", "small"))}}
CVNETS_BOX_TO_YX = [1, 0, 3, 2]  # cvnets regresses (tx, ty, tw, th); edgevit's boxes are y first
# how the PyTorch route makes a file: litert-torch alone (fp32), PT2E int8 through litert-torch's quantizer,
# or ai-edge-quantizer's static int8 recipe on the fp32 file (AEQ)
PYTORCH_ROUTES = ("fp32", "pt2e_int8", "aeq_int8")


# Runs in the PyTorch Python: the twin with random weights of a sensible
# scale (a segmenter's logits scaled to a trained one's spread), its weights
# saved for edgevit to import, and one litert-torch file per route; prints
# each file's conversion seconds and its output cosine to the twin itself.
PYTORCH_ROUTE_CHILD = r"""
import json, sys, time
import numpy as np
import litert_torch, torch
from ai_edge_litert.interpreter import Interpreter
from edgevit.converters.checkpoints import write_safetensors
from edgevit.converters.parity import import_timm, randomize_, scale_logits_, torch_logits
from edgevit.litert.agreement import agreement
source, name, images_path, checkpoint_dir, out_prefix = sys.argv[1:6]
routes, cvnets_dir = sys.argv[6].split(","), sys.argv[7]
images = np.load(images_path)  # NHWC float32, normalised, in the channel order the twin takes
if source == "timm":
    module = import_timm().create_model(name, pretrained=False).eval()
    randomize_(module, seed=0)
    write_safetensors({k: v.detach().numpy() for k, v in module.state_dict().items()},
                      f"{checkpoint_dir}/model.safetensors")
    forward = module
elif source == "cvnets":  # ml-cvnets' SSDLite, built by a checkout given with --cvnets (its build.ssd)
    import os

    os.chdir(cvnets_dir)  # its build script and configs are found relative to it
    sys.path.insert(0, cvnets_dir)
    from build import ssd

    module = ssd("config/detection/ssd_coco/mobilevit.yaml", {"model.classification.mit.mode": name}).eval()
    randomize_(module, seed=0)
    write_safetensors({k: v.detach().numpy() for k, v in module.state_dict().items()},
                      f"{checkpoint_dir}/model.safetensors")

    class Detections(torch.nn.Module):  # one tensor, boxes then class logits per anchor (anchors are constants)
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, image):
            scores, boxes, _ = self.model.ssd_forward(self.model.get_backbone_features(image))
            return torch.cat([boxes, scores], dim=-1)

    forward = module = Detections(module).eval()
else:
    from edgevit.converters.hf_mobilevit import transformers_reference

    module = transformers_reference(name)
    randomize_(module, seed=0)
    scale_logits_(module, module.segmentation_head.classifier.convolution, images[:4])
    module.save_pretrained(checkpoint_dir)

    class Logits(torch.nn.Module):  # litert-torch converts tensors, not transformers' output classes
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values).logits

    forward = Logits(module).eval()
nchw = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
sample = (nchw[:1],)
float_out = torch_logits(module, images[:8])  # a segmenter's classes last, as edgevit's


def outputs_of(path):
    # PT2E's file takes and gives int8 (its input and output quantized): quantize, run, dequantize
    interp = Interpreter(model_path=path)
    interp.allocate_tensors()
    given, taken = interp.get_input_details()[0], interp.get_output_details()[0]
    rows = []
    for x in nchw[:8].numpy():
        if given["dtype"] != np.float32:
            scale, zero = given["quantization"]
            limits = np.iinfo(given["dtype"])
            x = np.clip(np.round(x / scale + zero), limits.min, limits.max).astype(given["dtype"])
        interp.set_tensor(given["index"], x[None])
        interp.invoke()
        y = interp.get_tensor(taken["index"])[0]
        if taken["dtype"] != np.float32:
            scale, zero = taken["quantization"]
            y = (y.astype(np.float32) - zero) * scale
        rows.append(y)
    return np.stack(rows) if rows[0].ndim <= 2 else np.moveaxis(np.stack(rows), 1, -1)


for route in routes:
    path = f"{out_prefix}_{route}.tflite"
    start = time.perf_counter()
    if route == "fp32":
        litert_torch.convert(forward, sample).export(path)
    elif route == "pt2e_int8":
        from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
        from litert_torch.quantize.quant_config import QuantConfig
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(torch.export.export(forward, sample).module(), quantizer)
        with torch.no_grad():
            for x in nchw:
                prepared(x[None])
        quantized = convert_pt2e(prepared, fold_quantize=False)
        litert_torch.convert(quantized, sample, quant_config=QuantConfig(pt2e_quantizer=quantizer)).export(path)
    elif route == "aeq_int8":
        from ai_edge_quantizer import quantizer, recipe

        aeq = quantizer.Quantizer(f"{out_prefix}_fp32.tflite", recipe.static_wi8_ai8())
        signatures = Interpreter(model_path=f"{out_prefix}_fp32.tflite").get_signature_list()
        key, signature = next(iter(signatures.items()))
        calibration = aeq.calibrate({key: [{signature["inputs"][0]: x[None].numpy()} for x in nchw]})
        aeq.quantize(calibration).export_model(path, overwrite=True)
    seconds = time.perf_counter() - start
    cosine = agreement(float_out, outputs_of(path))["cosine_mean"]
    print("route " + json.dumps({"route": route, "path": path, "convert_seconds": seconds, "cosine": cosine}),
          flush=True)
"""


def pytorch_route(name: str, size: int, calib_samples: int, out_dir: Path, python: str,
                  routes: list[str], cvnets: str) -> tuple[list[dict], str | None]:
    """(file entries of the model's PyTorch twin, one per route that
    ``python`` converted, edgevit weights file holding the twin's weights),
    or ([], None) where that Python lacks torch/litert-torch or the model
    has no twin."""
    if name not in PYTORCH_TWINS or not routes:
        return [], None
    from edgevit.converters.api import import_weights
    from edgevit.data.sample_photos import sample_batch
    from edgevit.litert.interpreter import describe_child_failure
    from edgevit.registry import get_spec

    source, twin, channel_order = PYTORCH_TWINS[name]
    images = sample_batch(get_spec(name).preprocessing_at(size), calib_samples)
    np.save(out_dir / f"{name}_twin_images.npy", images[..., ::-1] if channel_order == "BGR" else images)
    checkpoint_dir = out_dir / f"{name}_twin"
    checkpoint_dir.mkdir()
    proc = subprocess.run([python, "-c", PYTORCH_ROUTE_CHILD, source, twin, str(out_dir / f"{name}_twin_images.npy"),
                           str(checkpoint_dir), str(out_dir / f"{name}_pytorch_route"), ",".join(routes), cvnets],
                          capture_output=True, text=True)
    converted = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("route ")]
    if proc.returncode != 0:
        print(f"PyTorch route of {name} stopped after {len(converted)} of {len(routes)} files: "
              f"{describe_child_failure(proc.returncode, proc.stderr)}", file=sys.stderr)
    if not converted:
        return [], None
    weights = out_dir / f"{name}.weights.h5"
    import_weights(checkpoint_dir / "model.safetensors", name, weights, source=source, input_size=size)
    entries = [{"model": name, "precision": f"pytorch_route_{c['route']}", "path": Path(c["path"]),
                "channel_order": channel_order, "source": source, "convert_seconds": round(c["convert_seconds"], 1),
                "size_bytes": Path(c["path"]).stat().st_size, "cosine_mean": round(c["cosine"], 4)}
               for c in converted]
    return entries, str(weights)


def convert_all(models, precisions, size, calib_samples, out_dir: Path, pytorch_python: str,
                pytorch_routes: list[str], cvnets: str) -> list[dict]:
    import edgevit
    from edgevit.export.pipeline import ExportOptions, export
    from edgevit.registry import get_spec

    files = []
    for name in models:
        twins, weights = pytorch_route(name, size, calib_samples, out_dir, pytorch_python, pytorch_routes, cvnets)
        for precision in precisions:
            model = edgevit.create_model(name, input_size=size, weights=weights)
            out = out_dir / f"{name}_{precision}.tflite"
            start = time.perf_counter()
            report = export(model, get_spec(name), ExportOptions(
                precision=precision, output=str(out), calib_samples=calib_samples, validation_samples=8,
                gpu_images=0, recalibrate_batchnorm=weights is None, io_dtype="float32")).to_dict()
            seconds = time.perf_counter() - start
            files.append({"model": name, "precision": precision, "path": out,
                          "convert_seconds": round(report["seconds"]["convert"], 1),
                          "export_seconds": round(seconds, 1), "size_bytes": report["size_bytes"],
                          "cosine_mean": round(report["agreement"]["cosine_mean"], 4)})
            print(f"converted {name} {precision}: {report['seconds']['convert']:.1f} s", file=sys.stderr)
        own_fp32 = out_dir / f"{name}_fp32.tflite"
        for twin in twins:
            if twin["precision"] == "pytorch_route_fp32" and own_fp32.exists():
                twin["cosine_vs_edgevit_fp32"] = round(_output_cosine(twin, own_fp32, size), 5)
        files += twins
    return files


def _output_cosine(twin: dict, own: Path, size: int) -> float:
    """Output cosine of the PyTorch route's file (NCHW input in the twin's
    channel order) and edgevit's on one random image, per pixel for a
    segmenter: the two compute the same function where the weights match."""
    from edgevit.litert.agreement import agreement
    from edgevit.litert.interpreter import load_interpreter

    image = np.random.default_rng(0).random((1, size, size, 3), dtype=np.float32)
    outputs = []
    for path, x in ((twin["path"], image[..., ::-1] if twin["channel_order"] == "BGR" else image), (own, image)):
        interp = load_interpreter(path.read_bytes())
        interp.allocate_tensors()
        detail = interp.get_input_details()[0]
        interp.set_tensor(detail["index"], np.ascontiguousarray(
            x if tuple(detail["shape"]) == x.shape else x.transpose(0, 3, 1, 2)))
        interp.invoke()
        # a detector's boxes and class values, joined per anchor as its twin gives them
        tensors = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
        outputs.append(np.concatenate(sorted(tensors, key=lambda t: t.shape[-1]), axis=-1))
    theirs, ours = outputs
    if twin["source"] == "cvnets":
        # cvnets' file gives (tx, ty, tw, th) and the 81 raw class logits, edgevit's (ty, tx, th, tw) and the
        # softmax's scores with the background (class 0) left out: 4 + 81 against 4 + 80 values per anchor.
        # Boxes and scores apart (the boxes' scale would hide the scores'), the lower cosine
        logits = theirs[..., 4:]
        scores = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores = scores / scores.sum(axis=-1, keepdims=True)
        return min(agreement(ours[..., :4], theirs[..., CVNETS_BOX_TO_YX])["cosine_mean"],
                   agreement(ours[..., 4:], scores[..., 1:])["cosine_mean"])
    if theirs.shape != ours.shape:  # a segmenter's NCHW logits
        theirs = np.moveaxis(theirs, 1, -1)
    return agreement(ours, theirs)["cosine_mean"]


def time_interleaved(files, threads_list, rounds, runs_per_round, warmup) -> None:
    from edgevit.litert.interpreter import load_interpreter

    interpreters = {}
    for f in files:
        for threads in threads_list:
            interp = load_interpreter(f["path"].read_bytes(), num_threads=threads)
            interp.allocate_tensors()
            detail = interp.get_input_details()[0]
            interp.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
            for _ in range(warmup):
                interp.invoke()
            interpreters[(str(f["path"]), threads)] = interp
            f.setdefault("ms", {})[threads] = []
    for r in range(rounds):
        for f in files:
            for threads in threads_list:
                interp = interpreters[(str(f["path"]), threads)]
                for _ in range(runs_per_round):
                    start = time.perf_counter()
                    interp.invoke()
                    f["ms"][threads].append((time.perf_counter() - start) * 1e3)
        print(f"round {r + 1}/{rounds}", file=sys.stderr)


def summarise(files, threads_list, arm_profiles=()) -> list[dict]:
    fp32 = {f["model"]: f for f in files if f["precision"] == "fp32"}
    rows = []
    for f in files:
        row = {k: v for k, v in f.items() if k not in ("path", "ms", "arm", "channel_order", "source")}
        for profile in arm_profiles:
            count = f["arm"][profile]
            row[f"arm_{profile}_M"] = round(count.instructions / 1e6, 1)
            base = fp32.get(f["model"])
            if base is not None:
                row[f"arm_{profile}_vs_fp32"] = round(count.instructions / base["arm"][profile].instructions, 3)
            row.setdefault("arm_families", {})[profile] = count.families
        for threads in threads_list:
            median = statistics.median(f["ms"][threads])
            row[f"median_ms_{threads}t"] = round(median, 2)
            base = fp32.get(f["model"])
            if base is not None:
                row[f"vs_fp32_{threads}t"] = round(median / statistics.median(base["ms"][threads]), 3)
        rows.append(row)
    return rows


def count_on_arm(files, profiles_text: str) -> list[str]:
    """Exact instructions per inference of every file on each Arm64 profile,
    into each file's entry (``arm``: profile -> count); the profiles counted."""
    from edgevit.litert.arm import HOW_TO_INSTALL, emulator_missing, parse_profiles
    from edgevit.profile.arm import count_many

    if profiles_text == "none":
        return []
    profiles = parse_profiles(profiles_text)
    missing = emulator_missing()
    if missing:
        print(f"Arm64 counts skipped: {missing}; {HOW_TO_INSTALL}", file=sys.stderr)
        return []
    counts = count_many([f["path"] for f in files], profiles, runs=1,
                        step=lambda message: print(message, file=sys.stderr))
    for f, (_, count) in zip([f for f in files for _ in profiles], counts):
        f.setdefault("arm", {})[count.profile] = count
    return [p.name for p in profiles]


def print_arm_race(name: str, rows: list[dict]) -> None:
    """edgevit's files against the PyTorch route's on the phone kernels'
    instruction counts, fp32 with fp32 and best int8 with best int8 (the goal:
    edgevit's fewer, ratio < 1)."""
    column = f"arm_{ARM_TARGET_PROFILE}_M"
    counts = {r["precision"]: r[column] for r in rows if r["model"] == name and column in r}
    pairs = {"fp32": (["fp32"], ["pytorch_route_fp32"]),
             "best int8": (["int8", "int8_mixed"], ["pytorch_route_pt2e_int8", "pytorch_route_aeq_int8"])}
    for label, (ours, theirs) in pairs.items():
        ours, theirs = [counts[p] for p in ours if p in counts], [counts[p] for p in theirs if p in counts]
        if ours and theirs:
            ratio = round(min(ours) / min(theirs), 3)
            verdict = "ahead" if ratio < 1 else "BEHIND"
            print(f"{name} {label} on Arm64 ({ARM_TARGET_PROFILE} kernels): {min(ours)} M instructions, "
                  f"{ratio}x the PyTorch route's {min(theirs)} M -> {verdict}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--precisions", nargs="+", default=DEFAULT_PRECISIONS)
    parser.add_argument("--input-size", type=int, default=256)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs-per-round", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--calib-samples", type=int, default=64)
    parser.add_argument("--pytorch-python", default=sys.executable,
                        help="Python with torch, timm and litert-torch for the PyTorch route (default: this one).")
    parser.add_argument("--pytorch-routes", nargs="*", default=list(PYTORCH_ROUTES), choices=PYTORCH_ROUTES,
                        help="The PyTorch route's files: litert-torch fp32, PT2E int8, ai-edge-quantizer int8 "
                             "(none: skip the route).")
    parser.add_argument("--cvnets", default="",
                        help="ml-cvnets checkout with a build.py whose ssd(config, overrides) builds its SSDLite "
                             "(the detectors' twin; without it their route stops with the import error).")
    parser.add_argument("--arm", default="a76,max",
                        help="Arm64 CPU profiles to count instructions on (LiteRT 1.4 aarch64, emulated), or none.")
    parser.add_argument("--json", dest="json_path", default=None, help="Also write the rows as JSON here.")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="edgevit-bench-") as tmp:
        files = convert_all(args.models, args.precisions, args.input_size, args.calib_samples, Path(tmp),
                            args.pytorch_python, args.pytorch_routes, args.cvnets)
        time_interleaved(files, args.threads, args.rounds, args.runs_per_round, args.warmup)
        arm_profiles = count_on_arm(files, args.arm)
    rows = summarise(files, args.threads, arm_profiles)

    from edgevit.cli.output import print_table
    from edgevit.profile.host import host_description

    columns = ["model", "precision", "size_bytes", "convert_seconds", "cosine_mean", "cosine_vs_edgevit_fp32"]
    columns += [c for t in args.threads for c in (f"median_ms_{t}t", f"vs_fp32_{t}t")]
    columns += [c for p in arm_profiles for c in (f"arm_{p}_M", f"arm_{p}_vs_fp32")]
    host = host_description()
    print_table(f"LiteRT XNNPACK on {host}, {args.input_size}x{args.input_size}, medians of "
                f"{args.rounds * args.runs_per_round} interleaved runs", columns,
                [[row.get(c, "") for c in columns] for row in rows])
    if arm_profiles:
        from edgevit.profile.arm import NOT_CYCLES

        print(f"arm_<profile>_M: millions of instructions per inference on LiteRT 1.4's Arm64 kernels (emulated, "
              f"XNNPACK, 1 thread); {NOT_CYCLES}.")
    if host.endswith("int8 dot product: none)"):
        print("This CPU has no int8 dot product: the int8 ratios below do not represent phones or VNNI hosts.")
    elif "amx_int8" in host:
        print("XNNPACK runs int8 GEMMs on AMX tiles here: int8 ratios come out lower than on CPUs with "
              "VNNI or Arm dotprod/i8mm only (docs/profiling.md, kernel by kernel).")
    by_key = {(r["model"], r["precision"]): r for r in rows}
    for (name, precision), target in TARGETS.items():
        row = by_key.get((name, precision))
        if row and "vs_fp32_1t" in row:
            verdict = "meets" if row["vs_fp32_1t"] <= target else "MISSES"
            print(f"{name} {precision}: {row['vs_fp32_1t']}x fp32 (target <= {target}) -> {verdict}")
    for name, target in ARM_TARGETS.items():
        ratios = [r.get(f"arm_{ARM_TARGET_PROFILE}_vs_fp32") for r in rows
                  if r["model"] == name and r["precision"] in ("int8", "int8_mixed")]
        ratios = [x for x in ratios if x is not None]
        if ratios:
            verdict = "meets" if min(ratios) <= target else "MISSES"
            print(f"{name} best int8 file on Arm64 ({ARM_TARGET_PROFILE} kernels): {min(ratios)}x fp32's instructions "
                  f"(target <= {target}) -> {verdict}")
    for name in PYTORCH_TWINS:
        twin, own = by_key.get((name, "pytorch_route_fp32")), by_key.get((name, "fp32"))
        if twin and own and "median_ms_1t" in own:
            ratio = round(own["median_ms_1t"] / twin["median_ms_1t"], 3)
            verdict = "meets" if ratio <= PYTORCH_ROUTE_TARGET else "MISSES"
            print(f"{name} fp32: {ratio}x the PyTorch route's fp32 file (target <= {PYTORCH_ROUTE_TARGET}) "
                  f"-> {verdict}")
        if ARM_TARGET_PROFILE in arm_profiles:
            print_arm_race(name, rows)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"host": host, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
