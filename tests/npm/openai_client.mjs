// Drives `ultra serve` with the official openai npm package (run by tests/test_server.cpp):
//   node openai_client.mjs BASE_URL API_KEY
// prints one JSON object with what the client received: a chat completion, the same one streamed, a legacy
// completion with logprobs, and the error the client raises for a refused request.
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const messages = [{ role: "user", content: "Good morrow, fair lady!" }];
const out = {};

const chat = await client.chat.completions.create({ model: "bundled", messages, max_tokens: 12, temperature: 0 });
out.chat = {
  object: chat.object,
  model: chat.model,
  content: chat.choices[0].message.content,
  role: chat.choices[0].message.role,
  finish_reason: chat.choices[0].finish_reason,
  usage: chat.usage,
};

const stream = await client.chat.completions.create({
  model: "bundled", messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
});
out.stream = { content: "", chunks: 0, finish_reason: null, usage: null, role: null };
for await (const chunk of stream) {
  out.stream.chunks++;
  if (chunk.usage) out.stream.usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta.role) out.stream.role = c.delta.role;
    if (c.delta.content) out.stream.content += c.delta.content;
    if (c.finish_reason) out.stream.finish_reason = c.finish_reason;
  }
}

const cmpl = await client.completions.create({ model: "bundled", prompt: "ROMEO:", max_tokens: 6, temperature: 0, logprobs: 2 });
out.completion = { text: cmpl.choices[0].text, logprobs: cmpl.choices[0].logprobs, usage: cmpl.usage };

try {
  await client.chat.completions.create({ model: "bundled", messages, n: 17 });
  out.error = null;
} catch (e) {
  out.error = { status: e.status, message: e.error?.message ?? String(e), param: e.error?.param ?? null };
}
process.stdout.write(JSON.stringify(out) + "\n");
