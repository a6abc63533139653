"""SSDLite on MobileViT: the detection contract (two outputs, anchors in the
order of the A axis), parameter counts as published, ImageNet weights into
the backbone by name, a graph that converts to plain TFLite ops, and cvnets
checkpoints that give the official model's outputs.

The official reference (tests/data/ssdlite_mobilevit_v1_xxs_cvnets.npz) is
ml-cvnets 7771756 (``cvnets/models/detection/ssd.py``, the COCO config
``config/detection/ssd_coco/mobilevit.yaml`` with ``mit.mode=xx_small``,
5 classes) run once outside the project at 192 px on the seeded weights and
input of tests/ssdlite_reference.py: its state dict's names and shapes, its
box regressions, class logits and anchors before post-processing.
"""
import numpy as np
import pytest

import edgevit
from edgevit.converters import import_weights
from edgevit.errors import EdgevitError
from edgevit.export.convert import convert
from edgevit.export.graph import describe
from edgevit.info import count_params
from edgevit.litert.flatbuffer import read
from edgevit.models.ssdlite import BACKBONES, CENTER_VARIANCE, SIZE_VARIANCE, anchor_boxes
from edgevit.registry import get_spec
from tests import ssdlite_reference as ref
from tests.official_checkpoints import write_checkpoint

REFERENCE = "tests/data/ssdlite_mobilevit_v1_xxs_cvnets.npz"
XXS = "ssdlite_mobilevit_v1_xxs"
# Parameters (M) as published: ml-cvnets v0.1's MobileViT README (the
# MobileViT paper's COCO table) and ml-cvnets' model zoo for MobileViTv2.
PUBLISHED_M = {
    "ssdlite_mobilevit_v1_xxs": 1.8, "ssdlite_mobilevit_v1_xs": 2.7, "ssdlite_mobilevit_v1_s": 5.7,
    "ssdlite_mobilevit_v2_050": 2.0, "ssdlite_mobilevit_v2_075": 3.6, "ssdlite_mobilevit_v2_100": 5.6,
    "ssdlite_mobilevit_v2_125": 8.2, "ssdlite_mobilevit_v2_150": 11.3, "ssdlite_mobilevit_v2_175": 14.9,
    "ssdlite_mobilevit_v2_200": 19.1,
}
# cvnets' own models (81 classes), counted where the reference was made
CVNETS_PARAMS = {"ssdlite_mobilevit_v1_xxs": 1_755_050, "ssdlite_mobilevit_v1_xs": 2_742_042,
                 "ssdlite_mobilevit_v1_s": 5_738_826}


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(REFERENCE))


@pytest.fixture(scope="module")
def imported(reference, tmp_path_factory):
    """The reference's weights as a cvnets checkpoint, imported."""
    shapes = {str(name): tuple(int(d) for d in shape.split(",")) for name, shape in
              zip(reference["names"], reference["shapes"])}
    path = write_checkpoint(ref.random_state_dict(shapes), tmp_path_factory.mktemp("ssd") / "ssd_mobilevit_xxs.pt")
    return import_weights(path, XXS, num_classes=ref.CLASSES, input_size=ref.SIZE)


def test_registry_holds_the_detectors_as_users_name_them():
    names = edgevit.list_models("ssdlite_*")
    assert names == sorted(BACKBONES)
    assert {"ssdlite_mobilevit_v1_xs", "ssdlite_mobilevit_v1_s", "ssdlite_mobilevit_v2_100",
            "ssdlite_mobilevit_v3_xs"} <= set(names)
    for name in names:
        spec = get_spec(name)
        assert (spec.task, spec.num_classes, spec.default_input_size) == ("detection", 81, 320)


@pytest.mark.parametrize("name", sorted(PUBLISHED_M))
def test_parameter_count_equals_published(name):
    assert round(get_spec(name).parameters / 1e6, 1) == PUBLISHED_M[name]
    if name in CVNETS_PARAMS:
        assert get_spec(name).parameters == CVNETS_PARAMS[name]


def test_outputs_and_anchors_follow_the_contract(imported, reference):
    model = imported.model
    assert model.output_names == ["boxes", "scores"]
    assert [tuple(o.shape) for o in model.outputs] == [(None, 1168, 4), (None, 1168, ref.CLASSES)]
    assert count_params(model) == sum(int(np.prod(s.split(","), dtype=int)) for n, s in
                                      zip(reference["names"], reference["shapes"]) if "running" not in n)
    # cvnets' anchors are (cx, cy, w, h); the contract's (cy, cx, h, w)
    np.testing.assert_allclose(anchor_boxes(model), reference["anchors"][:, [1, 0, 3, 2]], atol=1e-7)
    assert (CENTER_VARIANCE, SIZE_VARIANCE) == (0.1, 0.2)
    at_320 = edgevit.create_model(XXS, num_classes=3)
    assert anchor_boxes(at_320).shape == (3232, 4) and tuple(at_320.outputs[1].shape) == (None, 3232, 3)
    with pytest.raises(EdgevitError, match="not an SSDLite detector"):
        anchor_boxes(edgevit.create_model("mobilevit_v1_xxs", input_size=64))


def test_cvnets_checkpoint_gives_the_official_outputs(imported, reference):
    report = imported.report
    assert report["source"] == "cvnets" and report["channel_order"].startswith("BGR")
    assert report["tensors"] == len(imported.model.weights)
    # cvnets v0.1 read BGR; the imported model takes RGB
    image = np.ascontiguousarray(ref.random_image().transpose(0, 2, 3, 1)[..., ::-1])
    boxes, scores = (np.asarray(t) for t in imported.model(image, training=False))
    np.testing.assert_allclose(boxes, reference["boxes"][..., [1, 0, 3, 2]], atol=1e-4)
    np.testing.assert_allclose(scores, reference["scores"], atol=1e-4)


def test_backbone_takes_the_classifier_weights_by_name(imported):
    classifier = edgevit.create_model("mobilevit_v1_xxs", input_size=ref.SIZE)
    shapes = {w.path: tuple(w.shape) for w in classifier.weights}
    backbone = [w for w in imported.model.weights if w.path in shapes]
    # all but conv_1x1_exp (a kernel, BatchNorm's four) and head.fc (kernel, bias)
    assert len(backbone) == len(classifier.weights) - 7
    assert all(shapes[w.path] == tuple(w.shape) for w in backbone)


def test_heads_convert_to_plain_reshapes_and_concatenations(imported):
    """Each output is a CONCATENATION of six RESHAPEs of a head's CONV_2D:
    no slicing, gathering or transposing on the way out."""
    graph = read(convert(imported.model, "fp32"))
    assert describe(graph).max_rank <= 4
    op = {t: graph.ops[i] for t, i in graph.producers.items()}
    for output in graph.outputs:
        concat = op[output]
        assert concat.name == "CONCATENATION" and len(concat.runtime_inputs) == 6
        for part in concat.runtime_inputs:
            assert op[part.index].name == "RESHAPE"
            assert op[op[part.index].runtime_inputs[0].index].name == "CONV_2D"
