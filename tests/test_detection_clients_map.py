"""Issue 55 on photos: the COCO mAP of MediaPipe's ObjectDetector's
detections of a detector's int8 files (both forms), and of the Task
Library's of the post-processing-op form, equals `edgevit eval`'s of the
same file: within 0.02 on eval's pixels, 0.03 on the photos. benchmarks/detector_clients_map.py end to end on 40
of ../shared's photos with shapes pasted on them, a detector trained for a
few epochs (the benchmark's own run trains longer: docs/benchmarks.md)."""
import pytest

from tests.standard_clients import missing

# The tolerance, met where MediaPipe sees eval's pixels (the post-processing alone differs). On photos
# MediaPipe resizes them as eval does, but reports its boxes in whole pixels of the photo, each truncated: measured
# 0.013 under eval's mAP on the benchmark's detector (docs/benchmarks.md); 8 photos of a 3-epoch detector vary
# more, hence the wider bound there.
TOLERANCE, ON_PHOTOS = 0.02, 0.03


# 5.5 minutes on the shared 2-core host (2026-11-29): training, two conversions, six evals, the clients on 8 photos
@pytest.mark.slow
@pytest.mark.shared_data
def test_clients_show_the_map_eval_measures_on_photos(shared_data, tmp_path):
    for client in ("mediapipe", "task_library"):
        if missing(client):
            pytest.skip(missing(client))
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "detector_clients_map.py"
    spec = importlib.util.spec_from_file_location("detector_clients_map", script)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    photos = tmp_path / "photos"
    photos.mkdir()
    for path in sorted((shared_data / "imagenet-sample").iterdir())[:40]:
        (photos / path.name).symlink_to(path)
    out = tmp_path / "run"
    assert benchmark.main(["--photos", str(photos), "--size", "96", "--epochs", "3", "--batch-size", "16",
                           "--out", str(out)]) == 0
    record = json.loads((out / "detector-clients-map.json").read_text())
    for form, clients in (("raw", ("mediapipe",)), ("postprocessing_op", ("mediapipe", "task_library"))):
        measured = record["map"][form]
        assert measured["edgevit_eval"]["images"] == record["val_images"] == 8
        for metric in ("map", "ap50"):
            assert abs(measured["mediapipe_on_eval_pixels"][metric] - measured["edgevit_eval"][metric]) <= TOLERANCE
            for client in clients:
                assert abs(measured[client][metric] - measured["edgevit_eval"][metric]) <= ON_PHOTOS, (form, client)
