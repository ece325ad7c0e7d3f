"""Generation backends of the zero-shot judges: local transformers (text LLMs and MLLMs) and OpenAI-compatible HTTP."""

from zero_shot.backends.base import Backend, ChatRequest, Generation, MediaInput, SamplingConfig


__all__ = ["Backend", "ChatRequest", "Generation", "MediaInput", "SamplingConfig"]
