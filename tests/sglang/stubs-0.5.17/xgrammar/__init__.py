"""Import-only stand-in for xgrammar in the SGLang 0.5.17 CPU tests.

0.5.17 imports `xgrammar.StructuralTag` and the `xgrammar.structural_tag` format classes at
module level (protocol models, function-call detectors); they must be pydantic model types.
Nothing the tests run calls xgrammar. Any other name raises ImportError, so SGLang's own
`try: from xgrammar import X` fallbacks are taken.
"""

from pydantic import BaseModel, ConfigDict


class StructuralTag(BaseModel):
    model_config = ConfigDict(extra="allow")


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise ImportError(f"xgrammar import stub: xgrammar.{name} is not available in tests")
