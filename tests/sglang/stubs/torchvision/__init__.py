"""Import-only stand-in for torchvision in the SGLang CPU tests.

The PyPI torchvision wheel does not load against a CPU torch of another build
(`torchvision::nms does not exist`), yet `sglang.srt.configs` and transformers import it at
module level. Nothing here runs: every function raises if called.
"""

__version__ = "0.0.0+importstub"
