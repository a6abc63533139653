"""SSDLite on MobileViT: the detection contract (two outputs, anchors in the
order of the A axis), parameter counts as published, ImageNet weights into
the backbone by name, a graph that converts to plain TFLite ops, and cvnets
checkpoints that give the official model's outputs.

The official references (tests/data/cvnets_<variant>.npz) are ml-cvnets
7771756 (``cvnets/models/detection/ssd.py``; ``config/detection/ssd_coco/
mobilevit.yaml`` with ``mit.mode=xx_small``, ``mobilevit_v2.yaml`` with
``mitv2.width_multiplier=0.5``; 5 classes) run once outside the project on
:func:`tests.official_checkpoints.seeded_tensor` weights and the input of
tests/ssdlite_reference.py: each keeps its
state dict's names and shapes, its box regressions, class logits and
anchors before post-processing.
"""
import numpy as np
import pytest

import edgevit
from edgevit.converters import import_weights
from edgevit.data.labels import default_labels
from edgevit.errors import EdgevitError
from edgevit.export.convert import convert
from edgevit.export.graph import describe
from edgevit.info import count_params
from edgevit.litert.flatbuffer import read
from edgevit.models.box_coding import CENTER_VARIANCE, SIZE_VARIANCE
from edgevit.models.ssdlite import BACKBONES, anchor_boxes
from edgevit.registry import get_spec
from tests import ssdlite_reference as ref
from tests.official_checkpoints import seeded_tensor, write_checkpoint

XXS = "ssdlite_mobilevit_v1_xxs"
# Parameters (M) as published: ml-cvnets v0.1's MobileViT README (the
# MobileViT paper's COCO table), ml-cvnets' model zoo for MobileViTv2, the
# MobileViTv3 README. Not MobileViTv3-0.5: its README says 2.0 M, the model
# counts 2,094,787 (its classifier's 1,429,985 is the README's 1.4 M).
PUBLISHED_M = {
    "ssdlite_mobilevit_v1_xxs": 1.8, "ssdlite_mobilevit_v1_xs": 2.7, "ssdlite_mobilevit_v1_s": 5.7,
    "ssdlite_mobilevit_v2_050": 2.0, "ssdlite_mobilevit_v2_075": 3.6, "ssdlite_mobilevit_v2_100": 5.6,
    "ssdlite_mobilevit_v2_125": 8.2, "ssdlite_mobilevit_v2_150": 11.3, "ssdlite_mobilevit_v2_175": 14.9,
    "ssdlite_mobilevit_v2_200": 19.1,
    "ssdlite_mobilevit_v3_xxs": 1.5, "ssdlite_mobilevit_v3_xs": 2.7, "ssdlite_mobilevit_v3_s": 5.5,
    "ssdlite_mobilevit_v3_075": 3.7, "ssdlite_mobilevit_v3_100": 5.8,
}
# cvnets' own models (81 classes), counted where the references were made
CVNETS_PARAMS = {"ssdlite_mobilevit_v1_xxs": 1_755_050, "ssdlite_mobilevit_v1_xs": 2_742_042,
                 "ssdlite_mobilevit_v1_s": 5_738_826}
# cvnets regresses (tx, ty, tw, th) against (cx, cy, w, h) anchors; the contract is y first
YX = [1, 0, 3, 2]


def reference(name):
    return dict(np.load(f"tests/data/cvnets_{name}.npz"))


def import_reference(name, folder):
    """The reference's weights as a cvnets checkpoint, imported (its class count read from the heads)."""
    data = reference(name)
    shapes = {str(n): tuple(int(d) for d in s.split(",")) for n, s in zip(data["names"], data["shapes"])}
    path = write_checkpoint({n: seeded_tensor(n, shape) for n, shape in shapes.items()}, folder / f"{name}.pt")
    return import_weights(path, name, input_size=ref.SIZES[name]), data


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return import_reference(XXS, tmp_path_factory.mktemp("ssd"))


def test_registry_holds_the_detectors_as_users_name_them():
    names = edgevit.list_models("ssdlite_*")
    assert names == sorted(BACKBONES)
    assert {"ssdlite_mobilevit_v1_xs", "ssdlite_mobilevit_v1_s", "ssdlite_mobilevit_v2_100",
            "ssdlite_mobilevit_v3_xs"} <= set(names)
    for name in names:
        spec = get_spec(name)
        assert (spec.task, spec.num_classes, spec.default_input_size) == ("detection", 81, 320)
    labels = default_labels(81, "detection")
    assert labels[:3] == ["background", "person", "bicycle"] and labels[-1] == "toothbrush" and len(set(labels)) == 81
    assert default_labels(81) == [f"class_{i}" for i in range(81)]


@pytest.mark.parametrize("name", sorted(PUBLISHED_M))
def test_parameter_count_equals_published(name):
    assert round(get_spec(name).parameters / 1e6, 1) == PUBLISHED_M[name]
    if name in CVNETS_PARAMS:
        assert get_spec(name).parameters == CVNETS_PARAMS[name]


def test_outputs_follow_the_contract_and_the_backbone_takes_classifier_weights(imported):
    result, data = imported
    model = result.model
    assert model.output_names == ["boxes", "scores"]
    assert [tuple(o.shape) for o in model.outputs] == [(None, 1168, 4), (None, 1168, ref.CLASSES)]
    assert count_params(model) == sum(int(np.prod(s.split(","), dtype=int)) for n, s in
                                      zip(data["names"], data["shapes"]) if "running" not in n)
    assert (CENTER_VARIANCE, SIZE_VARIANCE) == (0.1, 0.2)
    # same layer names as the classifier: its ImageNet weights fill the backbone by name
    classifier = edgevit.create_model("mobilevit_v1_xxs", input_size=64)
    shapes = {w.path: tuple(w.shape) for w in classifier.weights}
    backbone = [w for w in model.weights if w.path in shapes]
    # all but conv_1x1_exp (a kernel, BatchNorm's four) and head.fc (kernel, bias)
    assert len(backbone) == len(classifier.weights) - 7
    assert all(shapes[w.path] == tuple(w.shape) for w in backbone)
    with pytest.raises(EdgevitError, match="not an SSDLite detector"):
        anchor_boxes(classifier)


def check_official_outputs(result, data, name):
    report, model = result.report, result.model
    bgr = name.startswith("ssdlite_mobilevit_v1_")
    assert report["source"] == "cvnets" and report["channel_order"].startswith("BGR" if bgr else "RGB")
    assert report["tensors"] == len(model.weights) and report["num_classes"] == ref.CLASSES
    np.testing.assert_allclose(anchor_boxes(model), data["anchors"][:, YX], atol=1e-7)
    image = ref.random_image(ref.SIZES[name]).transpose(0, 2, 3, 1)
    # cvnets v0.1 read BGR: the imported model takes RGB
    image = np.ascontiguousarray(image[..., ::-1] if bgr else image)
    boxes, scores = (np.asarray(t) for t in model(image, training=False))
    np.testing.assert_allclose(boxes, data["boxes"][..., YX], atol=1e-4)
    np.testing.assert_allclose(scores, data["scores"], atol=1e-4)


def test_cvnets_v1_checkpoint_gives_the_official_outputs(imported):
    check_official_outputs(*imported, XXS)


def test_cvnets_v2_checkpoint_gives_the_official_outputs(tmp_path):
    name = "ssdlite_mobilevit_v2_050"
    check_official_outputs(*import_reference(name, tmp_path), name)


def test_heads_convert_to_plain_reshapes_and_concatenations(imported):
    """Each output is a CONCATENATION of six RESHAPEs of a head's CONV_2D:
    no gathering or transposing on the way out; the file's scores are the
    softmax of the concatenated logits without the background column (one
    STRIDED_SLICE: edgevit.export.detection says why)."""
    graph = read(convert(imported[0].model, "fp32"))
    assert describe(graph).max_rank <= 4
    op = {t: graph.ops[i] for t, i in graph.producers.items()}
    boxes, scores = graph.outputs
    assert op[scores].name == "STRIDED_SLICE" and op[op[scores].runtime_inputs[0].index].name == "SOFTMAX"
    logits = op[op[scores].runtime_inputs[0].index].runtime_inputs[0].index
    for output in (boxes, logits):
        concat = op[output]
        assert concat.name == "CONCATENATION" and len(concat.runtime_inputs) == 6
        for part in concat.runtime_inputs:
            assert op[part.index].name == "RESHAPE"
            assert op[op[part.index].runtime_inputs[0].index].name == "CONV_2D"



def test_a_fresh_detectors_extra_levels_and_heads_start_xavier_uniform():
    """As cvnets resets them: the backbone's He-normal over the fan-out gave
    the output convolutions ~5 times Xavier's spread (logits and regressions
    of standard deviation 6-7 on a fresh model, a first loss of ~135 a
    matched anchor; the generated shapes were learned to mAP 0.08)."""
    model = edgevit.create_model(XXS, num_classes=3, input_size=64)
    head_convs = [layer for layer in model.layers if layer.name.startswith(("ssd_heads.", "extra_layers."))
                  and layer.__class__.__name__ in ("Conv2D", "DepthwiseConv2D")]
    assert len(head_convs) == 6 * 2 + 5 + 2 + 3 * 2 + 1   # outputs, depthwise, projections, extra levels, pool
    for layer in head_convs:
        kernel = np.asarray(layer.weights[0])
        *receptive, fan_in, fan_out = kernel.shape
        limit = np.sqrt(6 / ((fan_in + fan_out) * np.prod(receptive)))
        assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.5 * limit, layer.name
