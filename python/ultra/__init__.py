"""ultra: a C++20 LLM inference engine, from Python.

Low level (the public C++ API, ultra._core): Model, Tokenizer, TextStream, SamplingParams, Batch, Output,
Context, ChatFormatter, StopStrings. High level (pure Python): LLM with generate (many prompts by continuous
batching), complete and chat (OpenAI-shaped dicts, stream=True generators).

Errors: ultra.Error (a RuntimeError) for everything the engine reports; ultra.ModelError when a model or
tokenizer cannot be loaded; ultra.InvalidArgument (also a ValueError) for arguments the engine refuses.
Wrong Python types raise TypeError.

    import ultra
    llm = ultra.LLM("models/target.gguf", n_slots=4)
    for out in llm.generate(["ROMEO:", "JULIET:"], temperature=0, max_tokens=32):
        print(out.text, out.finish_reason)
"""

from ._core import (Batch, ChatFormatter, Context, Error, InvalidArgument, Model, ModelError, ModelInfo, Output,
                    RowToken, SamplingParams, SeqSnapshot, StopStrings, TextStream, Tokenizer)
from ._core import check_draft_compatible, generate, generate_speculative, perplexity
from ._llm import LLM, GenerationOutput, sampling_params

__version__ = "0.1.0"

__all__ = ["Batch", "ChatFormatter", "Context", "Error", "GenerationOutput", "InvalidArgument", "LLM", "Model",
           "ModelError", "ModelInfo", "Output", "RowToken", "SamplingParams", "SeqSnapshot", "StopStrings",
           "TextStream", "Tokenizer", "check_draft_compatible", "generate", "generate_speculative", "perplexity", "sampling_params",
           "__version__"]
