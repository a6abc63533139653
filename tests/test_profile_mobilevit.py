"""Every MobileViT variant must run entirely on the phone GPU delegate in
fp32/fp16 (and NNAPI on Android 13+): zero CPU fallbacks, one partition."""
import pytest

import edgevit
from edgevit.export.convert import convert
from edgevit.litert.delegates import check
from edgevit.registry import list_models


def _assert_fully_delegated(name, precision):
    reports = check(convert(edgevit.create_model(name), precision))
    for delegate, r in reports.items():
        assert r.fallbacks == [], (name, precision, delegate, r.fallbacks[:5])
        assert r.partitions == 1 and r.ops_on_delegate_by_default == r.ops > 100


def test_mobilevit_v3_xxs_fp32_has_no_gpu_fallbacks():
    _assert_fully_delegated("mobilevit_v3_xxs", "fp32")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", list_models("mobilevit*"))
def test_every_mobilevit_variant_is_fully_delegated(name, precision):
    _assert_fully_delegated(name, precision)
