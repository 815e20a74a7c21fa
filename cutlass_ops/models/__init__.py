"""Plain PyTorch reference networks, with their original state_dict names: what the fused
modules are checked against and load their weights from.

- ``se_resnet``: ``SEResNet9FixUp``, bps-nav's ``se_resnet9_fixup`` (for ``FusedResNet``);
- ``cvt``: CvT-13 (and CvT-21, CvT-W24), the Convolutional Vision Transformer (for ``FusedCvT``);
  ``cvt_specs``: their specs; ``cvt_hf``: Hugging Face transformers' CvT checkpoints as that
  reference."""
from .se_resnet import SE, SEFixupBasicBlock, SEResNet9FixUp, SpaceToDepth, depth_to_space, space_to_depth

__all__ = ["SE", "SEFixupBasicBlock", "SEResNet9FixUp", "SpaceToDepth", "depth_to_space", "space_to_depth"]
