"""Model families. Importing this package registers every variant."""
from edgevit.models import mobilevit, mobilevit_v2  # noqa: F401
from edgevit.models import convit, crossvit, cvt, deepvit, deit, mixer, pit, resmlp, vit  # noqa: F401
from edgevit.models import cswin, pvt, swin, t2t_vit  # noqa: F401
from edgevit.models import deeplabv3  # noqa: F401  (after the MobileViT backbones)
from edgevit.models import ssdlite  # noqa: F401
