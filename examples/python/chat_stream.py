"""A chat, streamed token by token (the OpenAI chunk shape `ultra serve` sends); Ctrl-C stops the answer.

    python3 examples/python/chat_stream.py [MODEL]
"""

import pathlib
import sys

import ultra

MODEL = str(pathlib.Path(__file__).resolve().parents[2] / "models" / "target.gguf")

llm = ultra.LLM(sys.argv[1] if len(sys.argv) > 1 else MODEL, n_slots=1)
messages = [{"role": "system", "content": "A scene from a play."},
            {"role": "user", "content": "Speak, good Romeo: what news?"}]
print(llm.chat_prompt(messages), end="", flush=True)
try:
    for chunk in llm.chat(messages, stream=True, max_tokens=96, temperature=0.8, stop=["\n\n"]):
        choice = chunk["choices"][0]
        print(choice["delta"].get("content", ""), end="", flush=True)
        if choice["finish_reason"]:
            print(f"\n[{choice['finish_reason']}]", file=sys.stderr)
except KeyboardInterrupt:
    print("\n[interrupted]", file=sys.stderr)
