// Tool calls through the official openai npm package (run by tests/test_server.cpp):
//   node openai_tools.mjs BASE_URL API_KEY [TEMPLATE.jinja ...]
// prints one JSON object with what the client received: a named tool_choice (the call enforced), the same
// request with tool_choice "required" streamed (tool_calls deltas put together by index, as clients do),
// and a follow-up turn that sends the call and its result back as history; then, per TEMPLATE (real chat
// templates, sent as the request's chat_template, so the call takes that template family's syntax), the
// named call and the streamed required call again, in out.templates[basename].
import OpenAI from "openai";
import fs from "node:fs";
import path from "node:path";

const [baseURL, apiKey, ...templates] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const tools = [{
  type: "function",
  function: {
    name: "set_day", description: "Sets the day",
    parameters: { type: "object", properties: { day: { type: "string", description: "The day", enum: ["mon", "tue", "sun"] } },
                  required: ["day"],
                  additionalProperties: false },
  },
}];
const messages = [{ role: "user", content: "Which day?" }];
const out = {};

const named = await client.chat.completions.create({
  model: "bundled", messages, tools, tool_choice: { type: "function", function: { name: "set_day" } },
  parallel_tool_calls: false, temperature: 1, seed: 3, max_tokens: 120,
});
out.named = { finish_reason: named.choices[0].finish_reason, message: named.choices[0].message };

out.stream = await streamed({});

// tool_choice "required", streamed: the content and the calls put together from the deltas
async function streamed(extra) {
  const s = await client.chat.completions.create({
    model: "bundled", messages, tools, tool_choice: "required", parallel_tool_calls: false, temperature: 1,
    seed: 4, max_tokens: 120, stream: true, ...extra,
  });
  const r = { content: "", calls: [], finish_reason: null };
  for await (const chunk of s) {
    for (const c of chunk.choices) {
      if (c.delta.content) r.content += c.delta.content;
      for (const tc of c.delta.tool_calls ?? []) {
        const call = (r.calls[tc.index] ??= { id: "", name: "", arguments: "" });
        if (tc.id) call.id = tc.id;
        if (tc.function?.name) call.name += tc.function.name;
        if (tc.function?.arguments) call.arguments += tc.function.arguments;
      }
      if (c.finish_reason) r.finish_reason = c.finish_reason;
    }
  }
  return r;
}
out.templates = {};
for (const t of templates) {
  const extra = { chat_template: fs.readFileSync(t, "utf8") };
  const n = await client.chat.completions.create({
    model: "bundled", messages, tools, tool_choice: { type: "function", function: { name: "set_day" } },
    parallel_tool_calls: false, temperature: 1, seed: 3, max_tokens: 120, ...extra,
  });
  out.templates[path.basename(t)] = { named: { finish_reason: n.choices[0].finish_reason, message: n.choices[0].message },
                                      stream: await streamed(extra) };
}

const call = named.choices[0].message.tool_calls[0];
const followup = await client.chat.completions.create({
  model: "bundled", tools, max_tokens: 4, temperature: 0,
  messages: [...messages, named.choices[0].message, { role: "tool", tool_call_id: call.id, content: "done" }],
});
out.followup = { finish_reason: followup.choices[0].finish_reason, usage: followup.usage };
process.stdout.write(JSON.stringify(out) + "\n");
