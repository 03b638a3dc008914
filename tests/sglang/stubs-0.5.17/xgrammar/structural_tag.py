"""The structural-tag format classes SGLang 0.5.17 imports, as permissive pydantic models."""

from pydantic import BaseModel, ConfigDict


class Format(BaseModel):
    model_config = ConfigDict(extra="allow")


class AnyTextFormat(Format): ...


class AnyTokensFormat(Format): ...


class ConstStringFormat(Format): ...


class ExcludeTokenFormat(Format): ...


class JSONSchemaFormat(Format): ...


class OptionalFormat(Format): ...


class OrFormat(Format): ...


class RegexFormat(Format): ...


class SequenceFormat(Format): ...


class StarFormat(Format): ...


class TagFormat(Format): ...


class TagsWithSeparatorFormat(Format): ...


class TokenFormat(Format): ...


class TriggeredTagsFormat(Format): ...
