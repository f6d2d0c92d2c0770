// `ultra serve`'s HTTP server, in process on a free loopback port with the bundled model, driven by
// cpp-httplib's client: greedy completions equal generate()'s (also 8 at once over 4 slots), SSE streams,
// stop strings, finish reasons, the OpenAI-shaped errors, a client leaving mid-stream, /tokenize, /metrics.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "grammar/gbnf_parser.h"
#include "grammar/grammar_matcher.h"
#include "jsonschema_check.h"
#include "raw_conn.h"
#include "sanitized.h"
#include "server/chat.h"
#include "server/constraints.h"
#include "server/server.h"
#include "swa_fixture.h"
#include "ultra/generate.h"
#include "ultra/grammar.h"

using json = nlohmann::json;
using namespace ultra;

namespace {

constexpr const char* kKey = "test-secret";
constexpr int kCtx = 256;

struct Env {
  Model model;
  std::shared_ptr<server::Scheduler> sched;
  std::unique_ptr<server::Server> srv;
  std::thread th;
  int port = 0;
};
Env* env = nullptr;

std::string model_path() {
  return std::string(ULTRA_SOURCE_DIR) + "/models/target.gguf";
}

// A server on the model at path, listening on a free loopback port.
Env* start_env(const std::string& path, int n_ctx = kCtx) {
  Env* e = new Env{Model::load(path), nullptr, nullptr, {}, 0};
  ContextParams cp;
  cp.n_ctx = n_ctx;
  cp.n_slots = 4;
  cp.n_batch = 64;  // small, so that prefill chunks share steps with decodes
  cp.n_threads = 2;
  e->sched = std::make_shared<server::Scheduler>(e->model, cp, 64);
  server::ServerOptions so;
  so.api_key = kKey;
  so.limits.max_body = 64 * 1024;
  e->srv = std::make_unique<server::Server>(so);
  e->port = e->srv->bind("127.0.0.1", 0);
  e->srv->attach(e->sched);
  e->th = std::thread([e] { e->srv->listen(); });
  return e;
}

void stop_env(Env* e) {
  e->sched->shutdown();
  e->srv->stop();
  e->th.join();
  delete e;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (env || !std::filesystem::exists(model_path())) return;
    env = start_env(model_path());
  }
  static void TearDownTestSuite() {
    if (!env) return;
    stop_env(env);
    env = nullptr;
  }
  void SetUp() override {
    if (!env) GTEST_SKIP() << "bundled model missing";
    ASSERT_GT(env->port, 0);
  }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", env->port);
    c.set_bearer_token_auth(kKey);
    c.set_read_timeout(30, 0);
    return c;
  }
  static json post(const std::string& path, const json& body, int expect = 200) {
    auto c = client();
    auto r = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, expect) << r->body;
    return json::parse(r->body, nullptr, false);
  }
  static std::map<std::string, double> metrics() {
    auto c = client();
    auto r = c.Get("/metrics");
    std::map<std::string, double> m;
    if (!r) return m;
    std::istringstream in(r->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      const size_t sp = line.find(' ');
      m[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    }
    return m;
  }
};

// generate()'s greedy text for a prompt, sequentially on a context of its own.
std::string reference(const std::string& prompt, int n, const Model* model = nullptr) {
  const Model& m = model ? *model : env->model;
  const Tokenizer& tok = *m.tokenizer();
  Context ctx(m, {.n_ctx = kCtx, .n_slots = 1, .n_threads = 2});
  ctx.set_sampling(0, SamplingParams::greedy());
  std::vector<int32_t> out;
  generate(ctx, tok.encode(prompt, true, true), {.n_predict = n}, [&](int32_t t, Context&, int) {
    if (!m.is_eog(t)) out.push_back(t);
    return true;
  });
  return tok.decode(out, true);
}

// The events of an SSE body: each "data: X" payload in order.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> ev;
  size_t i = 0;
  while (i < body.size()) {
    const size_t e = body.find("\n\n", i);
    EXPECT_NE(e, std::string::npos) << "unterminated event";
    if (e == std::string::npos) break;
    const std::string chunk = body.substr(i, e - i);
    EXPECT_EQ(chunk.rfind("data: ", 0), 0u) << chunk;
    ev.push_back(chunk.substr(6));
    i = e + 2;
  }
  return ev;
}

const char* kPrompts[8] = {"Once upon a time",        "The little dog",  "One day, a girl named Lily",
                           "Tom and his mom went to", "The sun was",     "In the park there was",
                           "She wanted to play with", "The big red ball"};

TEST_F(ServerTest, ConcurrentGreedyEqualsGenerate) {
  std::vector<std::string> want(8), got(8);
  for (int i = 0; i < 8; ++i) want[i] = reference(kPrompts[i], 16);
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&, i] {
      json r = post("/v1/completions", {{"prompt", kPrompts[i]}, {"max_tokens", 16}, {"temperature", 0}});
      if (r.is_object() && r.contains("choices")) got[i] = r["choices"][0]["text"];
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], want[i]) << kPrompts[i];
}

TEST_F(ServerTest, StreamingIsWellFormed) {
  const std::string want = reference(kPrompts[0], 12);
  auto c = client();
  json body = {{"prompt", kPrompts[0]},
               {"max_tokens", 12},
               {"temperature", 0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  auto ev = sse_events(r->body);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string text;
  json finish;
  json usage;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    json j = json::parse(ev[i]);
    EXPECT_EQ(j["object"], "text_completion");
    if (j.contains("usage")) {
      usage = j["usage"];
      continue;
    }
    text += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, want);
  EXPECT_TRUE(finish == "length" || finish == "stop");
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["total_tokens"], usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
}

TEST_F(ServerTest, StopStringsEndTheTextAndDoNotLeak) {
  const std::string full = reference(kPrompts[1], 24);
  ASSERT_GT(full.size(), 12u);
  const std::string stop = full.substr(6, 4);
  const std::string want = full.substr(0, full.find(stop));
  json r = post("/v1/completions",
                {{"prompt", kPrompts[1]}, {"max_tokens", 24}, {"temperature", 0}, {"stop", {"zzzz", stop}}});
  EXPECT_EQ(r["choices"][0]["text"], want);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  auto c = client();
  json body = {
      {"prompt", kPrompts[1]}, {"max_tokens", 24}, {"temperature", 0}, {"stop", stop}, {"stream", true}};
  auto s = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(s);
  std::string text;
  for (const auto& e : sse_events(s->body))
    if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, want);
}

TEST_F(ServerTest, MaxTokensGivesLength) {
  json r = post("/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 3}, {"ignore_eos", true}});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
  EXPECT_EQ(r["usage"]["prompt_tokens"], 3);
}

TEST_F(ServerTest, ChatCompletions) {
  json msgs = json::array({{{"role", "user"}, {"content", "Hello"}}});
  json r = post("/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 5}, {"model", "m1"}});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["model"], "m1");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string());
  auto c = client();
  auto s = c.Post("/v1/chat/completions",
                  json{{"messages", msgs}, {"max_tokens", 5}, {"stream", true}}.dump(), "application/json");
  ASSERT_TRUE(s);
  auto ev = sse_events(s->body);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(json::parse(ev[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(ev.back(), "[DONE]");
}

// Chat templates: /apply-template renders a request's own template (vLLM's chat_template field, llama.cpp's
// route) with chat_template_kwargs and add_generation_prompt; a chat completion through that template gives
// the same tokens as a completion of the rendered text; a template that raises is a 400 with its message.
TEST_F(ServerTest, ChatTemplates) {
  const std::string tmpl =
      "{{ bos_token }}{% for m in messages %}[{{ m.role | upper }}] {{ m.content | trim }}\n{% endfor %}"
      "{% if add_generation_prompt %}[ASSISTANT]{{ ' ' ~ greeting if greeting is defined }}{% endif %}";
  const json msgs = json::array(
      {{{"role", "system"}, {"content", "Be brief. "}}, {{"role", "user"}, {"content", " ROMEO, speak!"}}});
  json r =
      post("/apply-template",
           {{"messages", msgs}, {"chat_template", tmpl}, {"chat_template_kwargs", {{"greeting", "Well,"}}}});
  const std::string want = "<|endoftext|>[SYSTEM] Be brief.\n[USER] ROMEO, speak!\n[ASSISTANT] Well,";
  EXPECT_EQ(r["prompt"].get<std::string>(), want);
  r = post("/apply-template",
           {{"messages", msgs}, {"chat_template", tmpl}, {"add_generation_prompt", false}});
  EXPECT_EQ(r["prompt"].get<std::string>(), "<|endoftext|>[SYSTEM] Be brief.\n[USER] ROMEO, speak!\n");
  // Through a chat completion: the prompt is the rendered text's tokens (its BOS text is the BOS token; a
  // vocabulary that adds BOS itself does not add a second one when the text starts with it).
  json c = post("/v1/chat/completions", {{"messages", msgs},
                                         {"chat_template", tmpl},
                                         {"chat_template_kwargs", {{"greeting", "Well,"}}},
                                         {"max_tokens", 8},
                                         {"temperature", 0},
                                         {"ignore_eos", true}});
  const json ids = post("/tokenize", {{"content", want}})["tokens"];  // the BOS text is its special token
  json p =
      post("/v1/completions", {{"prompt", ids}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(c["choices"][0]["message"]["content"], p["choices"][0]["text"]);
  EXPECT_EQ(c["usage"]["prompt_tokens"], p["usage"]["prompt_tokens"]);
  json e = post("/apply-template",
                {{"messages", msgs}, {"chat_template", "{{ raise_exception('no system messages') }}"}}, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("no system messages"), std::string::npos) << e;
  e = post("/apply-template", {{"messages", msgs}, {"chat_template", "{% frobnicate %}"}}, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("frobnicate"), std::string::npos) << e;
}

TEST_F(ServerTest, Errors) {
  auto c = client();
  auto r = c.Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  json e = json::parse(r->body);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e["error"].contains("param") && e["error"].contains("code") && e["error"].contains("message"));

  e = post("/v1/completions", {{"prompt", "x"}, {"temperature", "hot"}}, 400);
  EXPECT_EQ(e["error"]["param"], "temperature");
  e = post("/v1/completions", {{"prompt", 5}}, 400);
  EXPECT_EQ(e["error"]["param"], "prompt");
  e = post("/v1/completions", {{"prompt", "x"}, {"n", 17}}, 400);
  EXPECT_EQ(e["error"]["param"], "n");
  e = post("/v1/chat/completions", {{"messages", "hi"}}, 400);
  EXPECT_EQ(e["error"]["param"], "messages");
  e = post("/v1/completions", {{"prompt", {1, 2, 3, 4}}, {"max_tokens", 1000}}, 400);
  const std::string msg = e["error"]["message"];
  EXPECT_NE(msg.find("4 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1000"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(kCtx)), std::string::npos) << msg;

  httplib::Client anon("127.0.0.1", env->port);
  r = anon.Post("/v1/completions", R"({"prompt":"x"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
  anon.set_bearer_token_auth("test-secreT");
  r = anon.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = anon.Get("/health");  // no key needed
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["status"], "ok");

  r = c.Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body)["error"].is_object());

  r = c.Post("/v1/completions", std::string(100 * 1024, ' '), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
}

// Constrained output (grammar, response_format json_object) is a sentence of its grammar and parses as
// JSON; bad grammars and fields are a 400 naming the field with the parser's message; a -100 logit_bias
// bans the token greedy decoding would pick.
// A template whose prompt ends inside a <think> block (as DeepSeek R1's does): the bundled model never
// writes </think>, so its whole output is reasoning. "reasoning_format": "none" gives the same text as
// content; streamed, delta.reasoning_content adds up to it. A harmony template (gpt-oss's markers) refuses a
// forced tool call, and the bundled model's plain text stays content.
TEST_F(ServerTest, ReasoningContent) {
  const json msgs = json::array({{{"role", "user"}, {"content", "Once upon a time"}}});
  const std::string think = "{% for m in messages %}{{ m.content }}{% endfor %}<think>\n";
  json body = {{"messages", msgs},
               {"chat_template", think},
               {"max_tokens", 12},
               {"temperature", 0},
               {"ignore_eos", true}};
  const json a = post("/v1/chat/completions", body);
  const json& m = a["choices"][0]["message"];
  ASSERT_TRUE(m.contains("reasoning_content")) << a.dump();
  const std::string thought = m["reasoning_content"].get<std::string>();
  EXPECT_FALSE(thought.empty());
  EXPECT_EQ(m["content"], "");
  body["reasoning_format"] = "none";
  const json b = post("/v1/chat/completions", body);
  EXPECT_EQ(b["choices"][0]["message"]["content"], thought);
  EXPECT_FALSE(b["choices"][0]["message"].contains("reasoning_content"));
  body.erase("reasoning_format");
  body["stream"] = true;
  auto c = client();
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  std::string streamed, content;
  for (const std::string& e : sse_events(r->body)) {
    if (e == "[DONE]") continue;
    const json d = json::parse(e)["choices"][0]["delta"];
    if (d.contains("reasoning_content")) streamed += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, thought);
  EXPECT_EQ(content, "");
  body = {{"messages", msgs}, {"max_tokens", 4}, {"reasoning_format", "sometimes"}};
  EXPECT_EQ(post("/v1/chat/completions", body, 400)["error"]["param"], "reasoning_format");

  const std::string harmony = "{% for m in messages %}{{ m.content }}{% endfor %}<|channel|>";
  const json tools = json::array(
      {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}});
  body = {{"messages", msgs},
          {"chat_template", harmony},
          {"max_tokens", 4},
          {"tools", tools},
          {"tool_choice", "required"}};
  EXPECT_EQ(post("/v1/chat/completions", body, 400)["error"]["param"], "tool_choice");
  body = {{"messages", msgs},
          {"chat_template", harmony},
          {"max_tokens", 8},
          {"temperature", 0},
          {"ignore_eos", true}};
  const json h = post("/v1/chat/completions", body);
  body["reasoning_format"] = "none";
  EXPECT_EQ(h["choices"][0]["message"]["content"],
            post("/v1/chat/completions", body)["choices"][0]["message"]["content"]);
  EXPECT_FALSE(h["choices"][0]["message"].contains("reasoning_content"));

  // History: an assistant's reasoning_content reaches gpt-oss's template as its `thinking`.
  std::ifstream f(std::filesystem::path(ULTRA_SOURCE_DIR) /
                  "tests/fixtures/templates/openai-gpt-oss-120b.jinja");
  const std::string gptoss((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(gptoss.empty());
  json described = tools;  // the template writes each tool's description
  described[0]["function"]["description"] = "The weather.";
  const json history =
      json::array({{{"role", "user"}, {"content", "Weather in Paris?"}},
                   {{"role", "assistant"},
                    {"content", nullptr},
                    {"reasoning_content", "Need to call f."},
                    {"tool_calls",
                     json::array({{{"id", "call_1"},
                                   {"type", "function"},
                                   {"function", {{"name", "f"}, {"arguments", "{\"city\": \"Paris\"}"}}}}})}},
                   {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}});
  const std::string prompt = post(
      "/apply-template", {{"messages", history}, {"chat_template", gptoss}, {"tools", described}})["prompt"];
  EXPECT_NE(prompt.find("<|channel|>analysis<|message|>Need to call f.<|end|>"), std::string::npos) << prompt;
}

TEST_F(ServerTest, GrammarResponseFormatAndLogitBias) {
  const char* g = R"(root ::= "{\"name\": \"" [a-z]{1,8} "\", \"n\": " [0-9]{1,3} "}")";
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    for (int seed : {1, 2, 3}) {
      json body = {{"grammar", g}, {"temperature", 1.0}, {"seed", seed}, {"max_tokens", 60}};
      if (std::string(path) == "/v1/completions") {
        body["prompt"] = "The answer is";
      } else {
        body["messages"] = json::array({{{"role", "user"}, {"content", "Give me JSON"}}});
      }
      const json r = post(path, body);
      const json& c = r["choices"][0];
      const std::string text = c.contains("text") ? c["text"] : c["message"]["content"];
      EXPECT_EQ(c["finish_reason"], "stop") << text;
      const json parsed = json::parse(text, nullptr, false);
      ASSERT_FALSE(parsed.is_discarded()) << text;
      EXPECT_TRUE(parsed["name"].is_string() && parsed["n"].is_number_integer()) << text;
    }
  }
  // Streamed chat: the deltas make up the same kind of object.
  {
    auto c = client();
    const json body = {{"messages", json::array({{{"role", "user"}, {"content", "JSON please"}}})},
                       {"grammar", g},
                       {"temperature", 1.0},
                       {"seed", 8},
                       {"max_tokens", 60},
                       {"stream", true}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    const std::vector<std::string> ev = sse_events(r->body);
    ASSERT_GE(ev.size(), 2u);
    std::string text, finish;
    for (size_t i = 0; i + 1 < ev.size(); ++i) {
      const json j = json::parse(ev[i]);
      const json& d = j["choices"][0]["delta"];
      if (d.contains("content") && d["content"].is_string()) text += d["content"].get<std::string>();
      if (j["choices"][0]["finish_reason"].is_string()) finish = j["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(finish, "stop");
    EXPECT_TRUE(json::parse(text, nullptr, false).is_object()) << text;
  }
  // json_object: any JSON object; a short answer may stop at max_tokens, and is then a prefix of one.
  const auto jg = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(server::kJsonObjectGrammar));
  for (int seed : {4, 5}) {
    const json r =
        post("/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", "JSON"}}})},
                                      {"response_format", {{"type", "json_object"}}},
                                      {"temperature", 0.7},
                                      {"seed", seed},
                                      {"max_tokens", 48}});
    const std::string text = r["choices"][0]["message"]["content"];
    if (r["choices"][0]["finish_reason"] == "stop") {
      EXPECT_TRUE(json::parse(text, nullptr, false).is_object()) << text;
    } else {
      EXPECT_TRUE(grammar::grammar_accepts_prefix(jg, text)) << text;
    }
    EXPECT_FALSE(text.empty());
    EXPECT_EQ(text[0], '{') << text;
  }

  json e =
      post("/v1/completions", {{"prompt", "x"}, {"grammar", "root ::= \"a\" ("}, {"max_tokens", 2}}, 400);
  EXPECT_EQ(e["error"]["param"], "grammar");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("line 1"), std::string::npos) << e;
  e = post("/v1/completions", {{"prompt", "x"}, {"grammar", "root ::= undefined_rule"}}, 400);
  EXPECT_EQ(e["error"]["param"], "grammar");
  // json_schema (llama.cpp's field) and response_format json_schema (OpenAI's): the output validates.
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"name", {{"type", "string"}, {"maxLength", 8}}},
                         {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 120}}}}},
                       {"required", {"name", "age"}},
                       {"additionalProperties", false}};
  const auto sg = std::make_shared<const grammar::Grammar>(
      grammar::parse_gbnf(ultra::json_schema_to_gbnf(schema.dump())));
  const auto validates = [](const json& v) {
    return v.is_object() && v.size() == 2 && v["name"].is_string() &&
           v["name"].get<std::string>().size() <= 8 && v["age"].is_number_integer() &&
           v["age"].get<int>() >= 0 && v["age"].get<int>() <= 120;
  };
  for (int seed : {4, 5}) {
    const json r = post("/v1/completions", {{"prompt", "Once upon a time"},
                                            {"json_schema", schema},
                                            {"temperature", 0.8},
                                            {"seed", seed},
                                            {"max_tokens", 200}});
    const std::string text = r["choices"][0]["text"];
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << text;
    EXPECT_TRUE(validates(json::parse(text, nullptr, false))) << text;
    const json c =
        post("/v1/chat/completions",
             {{"messages", json::array({{{"role", "user"}, {"content", "A person"}}})},
              {"response_format",
               {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}}}}},
              {"temperature", 0.8},
              {"seed", seed},
              {"max_tokens", 64}});
    const std::string ct = c["choices"][0]["message"]["content"];
    if (c["choices"][0]["finish_reason"] == "stop")
      EXPECT_TRUE(validates(json::parse(ct, nullptr, false))) << ct;
    else  // the bundled model may spend max_tokens on the whitespace the grammar allows
      EXPECT_TRUE(grammar::grammar_accepts_prefix(sg, ct)) << ct;
  }
  e = post("/v1/completions", {{"prompt", "x"}, {"json_schema", {{"type", "number"}, {"multipleOf", 3}}}},
           400);
  EXPECT_EQ(e["error"]["param"], "json_schema");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("unsupported keyword 'multipleOf'"),
            std::string::npos)
      << e;
  e = post("/v1/chat/completions",
           {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
            {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
           400);
  EXPECT_EQ(e["error"]["param"], "response_format");
  e = post("/v1/chat/completions",
           {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
            {"response_format", {{"type", "yaml"}}}},
           400);
  EXPECT_EQ(e["error"]["param"], "response_format");
  e = post("/v1/completions",
           {{"prompt", "x"}, {"grammar", g}, {"response_format", {{"type", "json_object"}}}}, 400);
  EXPECT_EQ(e["error"]["param"], "response_format");
  e = post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"99999999", -100}}}}, 400);
  EXPECT_EQ(e["error"]["param"], "logit_bias");
  e = post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"abc", -100}}}}, 400);
  EXPECT_EQ(e["error"]["param"], "logit_bias");
  e = post("/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"5", 300}}}}, 400);
  EXPECT_EQ(e["error"]["param"], "logit_bias");

  // logit_bias: the greedy first token, banned, is not drawn; a +100 bias forces a token.
  const Tokenizer& tok = *env->model.tokenizer();
  const std::string prompt = "Once upon a time";
  Context ctx(env->model, {.n_ctx = kCtx, .n_slots = 1, .n_threads = 2});
  ctx.set_sampling(0, SamplingParams::greedy());
  Batch b(64);
  b.add_sequence(tok.encode(prompt, true, true), 0, 0, Output::sample);
  ctx.step(b);
  const int32_t best = ctx.sampled(b.size() - 1);
  const json plain = post("/v1/completions", {{"prompt", prompt}, {"temperature", 0}, {"max_tokens", 1}});
  EXPECT_EQ(plain["choices"][0]["text"], tok.decode(std::vector<int32_t>{best}, true));
  const json banned = post("/v1/completions", {{"prompt", prompt},
                                               {"temperature", 0},
                                               {"max_tokens", 1},
                                               {"logit_bias", {{std::to_string(best), -100}}}});
  EXPECT_NE(banned["choices"][0]["text"], plain["choices"][0]["text"]);
  const int32_t forced = tok.encode(" zebra", false, false)[0];
  const json favoured = post("/v1/completions", {{"prompt", prompt},
                                                 {"temperature", 0},
                                                 {"max_tokens", 1},
                                                 {"logit_bias", json::array({json::array({forced, 100})})}});
  EXPECT_EQ(favoured["choices"][0]["text"], tok.decode(std::vector<int32_t>{forced}, true));
}

// The server on a context of 1024 tokens (beyond the bundled model's 256 positions: its output is
// constrained here), room for the tools' fallback prompt.
class ToolServerTest : public ServerTest {
 protected:
  static void SetUpTestSuite() {
    if (env || !std::filesystem::exists(model_path())) return;
    env = start_env(model_path(), 2048);
  }
};

// Tool calls with the bundled model (its play-script template does not render tools: the fallback prompt and
// Hermes tags). A named or required tool_choice is enforced: the reply's tool_calls parse and their arguments
// validate against the function's parameters, finish_reason "tool_calls", streamed as delta.tool_calls with
// no content leaked; bad tool definitions are a 400 naming the field.
const json kTimeTool = {{"type", "function"},
                        {"function",
                         {{"name", "get_time"},
                          {"parameters",
                           {{"type", "object"},
                            {"properties", {{"zone", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
                            {"required", {"zone"}}}}}}};
const json kDayTool = {{"type", "function"},
                       {"function",
                        {{"name", "set_day"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"day", {{"enum", {"mon", "tue", "sun"}}}}}},
                           {"required", {"day"}},
                           {"additionalProperties", false}}}}}};

bool valid_tool_call(const json& c) {
  if (!c.is_object() || c["type"] != "function" || !c["id"].is_string() || c["id"].get<std::string>().empty())
    return false;
  const json a = json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
  if (!a.is_object() || a.size() != 1) return false;
  if (c["function"]["name"] == "get_time")
    return a.contains("zone") && a["zone"].is_number_integer() && a["zone"] >= 0 && a["zone"] <= 9;
  if (c["function"]["name"] == "set_day")
    return a.contains("day") && (a["day"] == "mon" || a["day"] == "tue" || a["day"] == "sun");
  return false;
}

TEST_F(ToolServerTest, ForcedToolCallsParseAndValidate) {
  const json msgs = json::array({{{"role", "user"}, {"content", "What time is it?"}}});
  const json tools = json::array({kTimeTool, kDayTool});
  for (int seed : {1, 2, 3}) {
    // Named: that function, one call (parallel_tool_calls false: the grammar ends after it).
    json r = post("/v1/chat/completions",
                  {{"messages", msgs},
                   {"tools", tools},
                   {"tool_choice", {{"type", "function"}, {"function", {{"name", "set_day"}}}}},
                   {"parallel_tool_calls", false},
                   {"temperature", 1.0},
                   {"seed", seed},
                   {"max_tokens", 120}});
    json c = r["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r;
    EXPECT_TRUE(c["message"]["content"].is_null()) << r;
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r;
    EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "set_day");
    EXPECT_TRUE(valid_tool_call(c["message"]["tool_calls"][0])) << r;
    // Required: either function.
    r = post("/v1/chat/completions", {{"messages", msgs},
                                      {"tools", tools},
                                      {"tool_choice", "required"},
                                      {"parallel_tool_calls", false},
                                      {"temperature", 1.0},
                                      {"seed", seed},
                                      {"max_tokens", 120}});
    c = r["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r;
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r;
    EXPECT_TRUE(valid_tool_call(c["message"]["tool_calls"][0])) << r;
  }
  // Parallel calls: the output ends by itself ("tool_calls": every call validates) or at max_tokens
  // ("length": a call cut short leaves the whole text as content).
  for (int seed : {4, 5}) {
    const json r = post("/v1/chat/completions", {{"messages", msgs},
                                                 {"tools", tools},
                                                 {"tool_choice", "required"},
                                                 {"temperature", 1.0},
                                                 {"seed", seed},
                                                 {"max_tokens", 120}});
    const json& c = r["choices"][0];
    if (c["finish_reason"] == "length") {
      EXPECT_EQ(c["message"]["content"].get<std::string>().rfind("<tool_call>\n{\"name\": \"", 0), 0u) << r;
      continue;
    }
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r;
    ASSERT_GE(c["message"]["tool_calls"].size(), 1u) << r;
    for (const json& tc : c["message"]["tool_calls"]) EXPECT_TRUE(valid_tool_call(tc)) << r;
  }
}

TEST_F(ToolServerTest, ForcedToolCallsInEachOfSeveralChoices) {
  const json r =
      post("/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", "Day?"}}})},
                                    {"tools", json::array({kTimeTool, kDayTool})},
                                    {"tool_choice", "required"},
                                    {"parallel_tool_calls", false},
                                    {"n", 3},
                                    {"temperature", 1.0},
                                    {"seed", 21},
                                    {"max_tokens", 120}});
  ASSERT_EQ(r["choices"].size(), 3u) << r;
  for (const json& c : r["choices"]) {
    EXPECT_EQ(c["finish_reason"], "tool_calls") << r;
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u) << r;
    EXPECT_TRUE(valid_tool_call(c["message"]["tool_calls"][0])) << r;
  }
}

TEST_F(ToolServerTest, StreamedToolCallsAreDeltas) {
  auto cl = client();
  const json body = {{"messages", json::array({{{"role", "user"}, {"content", "Which day?"}}})},
                     {"tools", json::array({kTimeTool, kDayTool})},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}},
                     {"parallel_tool_calls", false},
                     {"temperature", 1.0},
                     {"seed", 11},
                     {"max_tokens", 120},
                     {"stream", true}};
  auto r = cl.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const std::vector<std::string> ev = sse_events(r->body);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string content, finish;
  json calls = json::array();  // assembled as OpenAI's clients do: by index, the arguments' pieces joined
  int pieces = 0;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    const json j = json::parse(ev[i]);
    const json& d = j["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const json& tc : d["tool_calls"]) {
        const size_t k = tc["index"];
        if (k == calls.size()) {  // its first delta: id, type and name
          EXPECT_TRUE(tc["id"].is_string() && tc["type"] == "function" && tc["function"]["name"].is_string())
              << tc;
          calls.push_back({{"id", tc["id"]},
                           {"type", "function"},
                           {"function", {{"name", tc["function"]["name"]}, {"arguments", ""}}}});
        }
        ASSERT_LT(k, calls.size()) << tc;
        const std::string piece = tc["function"]["arguments"];
        calls[k]["function"]["arguments"] = calls[k]["function"]["arguments"].get<std::string>() + piece;
        if (!piece.empty()) ++pieces;
      }
    if (j["choices"][0]["finish_reason"].is_string()) finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, "");  // the call's text is not leaked as content
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 1u) << r->body;
  EXPECT_EQ(calls[0]["function"]["name"], "get_time");
  EXPECT_TRUE(valid_tool_call(calls[0])) << r->body;
  EXPECT_GE(pieces, 2) << r->body;  // the arguments stream as they are written, not in one piece
}

// tool_choice auto leaves the output free and parses it: a grammar (the client's) that writes text and then a
// Hermes call gives the text as content (streamed as it comes) and the call as tool_calls.
TEST_F(ToolServerTest, AutoToolCallsAreParsedFromFreeOutput) {
  const char* g =
      R"(root ::= "Sure. <tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": " [1-9] "}}\n</tool_call>")";
  const json msgs = json::array({{{"role", "user"}, {"content", "Time?"}}});
  json r =
      post("/v1/chat/completions",
           {{"messages", msgs}, {"tools", {kTimeTool}}, {"grammar", g}, {"seed", 1}, {"max_tokens", 120}});
  const json& m = r["choices"][0]["message"];
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r;
  EXPECT_EQ(m["content"], "Sure. ");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_TRUE(valid_tool_call(m["tool_calls"][0])) << r;
  // Streamed: the content first, then the call.
  auto cl = client();
  auto s = cl.Post("/v1/chat/completions",
                   json({{"messages", msgs},
                         {"tools", {kTimeTool}},
                         {"grammar", g},
                         {"seed", 1},
                         {"max_tokens", 120},
                         {"stream", true}})
                       .dump(),
                   "application/json");
  ASSERT_TRUE(s);
  std::string content;
  int call_event = -1, last_content_event = -1;
  const std::vector<std::string> ev = sse_events(s->body);
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    const json d = json::parse(ev[i])["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string() && !d["content"].get<std::string>().empty()) {
      content += d["content"].get<std::string>();
      last_content_event = (int)i;
    }
    if (d.contains("tool_calls")) call_event = (int)i;
  }
  EXPECT_EQ(content, "Sure. ");
  EXPECT_GT(call_event, last_content_event);
  // tool_choice none: no parsing, the text is content.
  r = post("/v1/chat/completions", {{"messages", msgs},
                                    {"tools", {kTimeTool}},
                                    {"tool_choice", "none"},
                                    {"grammar", g},
                                    {"seed", 1},
                                    {"max_tokens", 120}});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(r["choices"][0]["message"]["content"].get<std::string>().rfind("Sure. <tool_call>", 0), 0u) << r;
}

// The tools reach the template: the request's own Qwen2.5 template renders them and the history's call and
// result (/apply-template); the bundled template gets the fallback prompt.
TEST_F(ToolServerTest, ToolsAndHistoryRenderThroughTheTemplate) {
  const std::string qwen = [] {
    std::ifstream f(std::string(ULTRA_SOURCE_DIR) +
                    "/tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }();
  const json msgs = json::parse(R"([{"role": "user", "content": "Time?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_time", "arguments": "{\"zone\": 3}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "noon"}])");
  json r = post("/apply-template", {{"messages", msgs}, {"tools", {kTimeTool}}, {"chat_template", qwen}});
  const std::string p = r["prompt"];
  EXPECT_NE(p.find("<tools>\n{\"function\": {\"name\": \"get_time\""), std::string::npos) << p;
  EXPECT_NE(p.find("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 3}}\n</tool_call>"),
            std::string::npos)
      << p;
  EXPECT_NE(p.find("<tool_response>\nnoon\n</tool_response>"), std::string::npos) << p;
  r = post("/apply-template", {{"messages", msgs}, {"tools", {kTimeTool}}});
  const std::string b = r["prompt"];
  EXPECT_EQ(b.rfind("You can call these functions", 0), 0u) << b;
  EXPECT_NE(
      b.find("JULIET:\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\":3}}\n</tool_call>"),
      std::string::npos)
      << b;
  EXPECT_NE(b.find("ROMEO:\n<tool_response>\nnoon\n</tool_response>"), std::string::npos) << b;
}

TEST_F(ToolServerTest, BadToolRequestsName400Fields) {
  const json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
  const auto err = [&](json extra) {
    json body = {{"messages", msgs}, {"max_tokens", 4}};
    body.update(extra);
    return post("/v1/chat/completions", body, 400)["error"];
  };
  json e = err({{"tools", {{{"type", "function"}, {"function", {{"name", "bad name"}}}}}}});
  EXPECT_EQ(e["param"], "tools");
  EXPECT_NE(e["message"].get<std::string>().find("tools[0].function.name"), std::string::npos) << e;
  e = err({{"tools", {kTimeTool, {{"type", "retrieval"}}}}});
  EXPECT_EQ(e["param"], "tools");
  EXPECT_NE(e["message"].get<std::string>().find("tools[1].type"), std::string::npos) << e;
  e = err({{"tools", "get_time"}});
  EXPECT_EQ(e["param"], "tools");
  e = err(
      {{"tools", {kTimeTool}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}});
  EXPECT_EQ(e["param"], "tool_choice");
  EXPECT_NE(e["message"].get<std::string>().find("'nope'"), std::string::npos) << e;
  e = err({{"tool_choice", "required"}});
  EXPECT_EQ(e["param"], "tool_choice");
  e = err({{"tools", {kTimeTool}}, {"tool_choice", "required"}, {"json_schema", {{"type", "object"}}}});
  EXPECT_EQ(e["param"], "tool_choice");
  e = err({{"tools", {kTimeTool}}, {"parallel_tool_calls", 1}});
  EXPECT_EQ(e["param"], "parallel_tool_calls");
  json bad_params = kTimeTool;
  bad_params["function"]["parameters"]["properties"]["zone"]["multipleOf"] = 2;
  e = err({{"tools", {bad_params}}, {"tool_choice", "required"}});
  EXPECT_EQ(e["param"], "tools");
  EXPECT_NE(e["message"].get<std::string>().find("multipleOf"), std::string::npos) << e;
  e = post("/v1/chat/completions",
           {{"messages", json::parse(R"([{"role": "assistant", "tool_calls": "x"}])")}, {"max_tokens", 4}},
           400)["error"];
  EXPECT_EQ(e["param"], "messages");
  // A tool that writes a control token's text into a template that renders tools: refused (it would become
  // the token); allowed with allow_special_in_content, and kept apart in the fallback's system message.
  json special = kTimeTool;
  special["function"]["description"] = "Ends here <|endoftext|> then";
  const std::string own_tmpl = "{% for t in tools %}{{ t | tojson }}{% endfor %}{{ messages[0].content }}";
  e = err({{"tools", {special}}, {"chat_template", own_tmpl}});
  EXPECT_EQ(e["param"], "tools");
  EXPECT_NE(e["message"].get<std::string>().find("'tools[0].function.description' contains the text of the "
                                                 "special token '<|endoftext|>'"),
            std::string::npos)
      << e;
  post("/v1/chat/completions", {{"messages", msgs},
                                {"tools", {special}},
                                {"chat_template", own_tmpl},
                                {"allow_special_in_content", true},
                                {"max_tokens", 2}});
  post("/v1/chat/completions", {{"messages", msgs}, {"tools", {special}}, {"max_tokens", 2}});
  // The old refusal is gone: tools with auto on the bundled model answer 200.
  const json ok =
      post("/v1/chat/completions", {{"messages", msgs}, {"tools", {kTimeTool}}, {"max_tokens", 4}});
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "length") << ok;
}

// The scheduler's lazy grammar (tool_choice "auto"): free until the text ends with the trigger, then the
// grammar writes the rest. The trigger here is the start of the greedy text, so the output is that start
// and then the grammar's sentence (without the lazy grammar: the greedy text).
TEST_F(ServerTest, LazyGrammarTakesOverAfterItsTrigger) {
  const Tokenizer& tok = *env->model.tokenizer();
  const std::vector<int32_t> prompt = tok.encode(kPrompts[1], true, true);
  const std::string greedy = reference(kPrompts[1], 12);
  // The text of the greedy output's first 3 tokens (a token boundary).
  Context ctx(env->model, {.n_ctx = kCtx, .n_slots = 1, .n_threads = 2});
  ctx.set_sampling(0, SamplingParams::greedy());
  std::vector<int32_t> out;
  generate(ctx, prompt, {.n_predict = 3}, [&](int32_t t, Context&, int) {
    out.push_back(t);
    return true;
  });
  const std::string trigger = tok.decode(out, true);
  ASSERT_FALSE(trigger.empty());
  ASSERT_EQ(greedy.rfind(trigger, 0), 0u);
  for (const bool lazy : {true, false}) {
    auto r = std::make_shared<server::GenRequest>();
    r->prompt = prompt;
    r->sampling = SamplingParams::greedy();
    r->max_tokens = 40;
    if (lazy) {
      r->lazy_trigger = trigger;
      r->lazy_grammar = "root ::= \" zebra zebra\"";
    }
    ASSERT_TRUE(env->sched->submit(r));
    std::string text, part;
    while (!r->wait_text(part, 5000)) text += part;
    text += part;
    if (lazy) {
      EXPECT_EQ(text, trigger + " zebra zebra");
      EXPECT_EQ(r->finish_reason, "stop");
    } else {
      EXPECT_EQ(text.substr(0, greedy.size()), greedy);
    }
  }
}

// n > 1: n completions of one prompt, each in a slot of its own with seed + i: greedy ones equal
// generate()'s, sampled ones follow their seeds (choice i of a request is the single request with seed + i);
// streamed, every chunk names its choice and each choice ends with its own finish_reason; usage adds the
// completions.
TEST_F(ServerTest, SeveralChoices) {
  json r =
      post("/v1/completions", {{"prompt", kPrompts[0]}, {"n", 3}, {"temperature", 0}, {"max_tokens", 12}});
  ASSERT_EQ(r["choices"].size(), 3u) << r;
  const std::string greedy = reference(kPrompts[0], 12);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], greedy);
    EXPECT_EQ(r["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], 36);
  const json msgs = json::array({{{"role", "user"}, {"content", "Hello"}}});
  r = post("/v1/chat/completions",
           {{"messages", msgs}, {"n", 4}, {"temperature", 1.0}, {"seed", 40}, {"max_tokens", 10}});
  ASSERT_EQ(r["choices"].size(), 4u) << r;
  std::set<std::string> distinct;
  for (int i = 0; i < 4; ++i) {
    const json one = post("/v1/chat/completions",
                          {{"messages", msgs}, {"temperature", 1.0}, {"seed", 40 + i}, {"max_tokens", 10}});
    EXPECT_EQ(r["choices"][i]["message"]["content"], one["choices"][0]["message"]["content"]) << i;
    distinct.insert(r["choices"][i]["message"]["content"].get<std::string>());
  }
  EXPECT_GT(distinct.size(), 1u);
  // Streamed.
  auto c = client();
  auto s = c.Post("/v1/chat/completions",
                  json({{"messages", msgs},
                        {"n", 2},
                        {"temperature", 1.0},
                        {"seed", 40},
                        {"max_tokens", 10},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}})
                      .dump(),
                  "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  std::string text[2];
  int finishes[2] = {0, 0};
  int completion_tokens = -1;
  for (const std::string& ev : sse_events(s->body)) {
    if (ev == "[DONE]") break;
    const json j = json::parse(ev);
    if (j.contains("usage") && j["usage"].is_object()) completion_tokens = j["usage"]["completion_tokens"];
    for (const json& ch : j["choices"]) {
      const int i = ch["index"];
      ASSERT_TRUE(i == 0 || i == 1) << ev;
      if (ch["delta"].contains("content")) text[i] += ch["delta"]["content"].get<std::string>();
      if (ch["finish_reason"].is_string()) ++finishes[i];
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(text[i], r["choices"][i]["message"]["content"]) << i;
    EXPECT_EQ(finishes[i], 1) << i;
  }
  EXPECT_EQ(completion_tokens, 20);
}

// n > 1 prefills the prompt once: the first choice's slot runs it but its last token, the other choices copy
// that KV into their slots (Context::copy_seq) and each prefills only the last token, for its own first
// sample (ultra_prompt_tokens_prefilled_total counts L + n - 1 tokens, not n L). More choices than slots
// (6 on 4) go in groups that fit. Each choice still equals the single request with its seed.
TEST_F(ServerTest, SeveralChoicesPrefillThePromptOnce) {
  const std::string prompt = "Once upon a time, in a land far away, there lived a little girl who loved to";
  const json body = {
      {"prompt", prompt}, {"temperature", 1.0}, {"seed", 7}, {"max_tokens", 6}, {"cache_prompt", false}};
  for (const int n : {3, 6}) {
    json req = body;
    req["n"] = n;
    const auto before = metrics();
    const json r = post("/v1/completions", req);
    const auto after = metrics();
    ASSERT_EQ(r["choices"].size(), (size_t)n) << r;
    const int L = r["usage"]["prompt_tokens"];
    const int groups = (n + 3) / 4;
    EXPECT_EQ(
        after.at("ultra_prompt_tokens_prefilled_total") - before.at("ultra_prompt_tokens_prefilled_total"),
        groups * L + (n - groups))
        << n;
    EXPECT_EQ(after.at("ultra_prompt_tokens_shared_total") - before.at("ultra_prompt_tokens_shared_total"),
              (n - groups) * (L - 1))
        << n;
    for (int i = 0; i < n; ++i) {
      json one = body;
      one["seed"] = 7 + i;
      const json single = post("/v1/completions", one);
      EXPECT_EQ(r["choices"][i]["text"], single["choices"][0]["text"]) << n << " " << i;
    }
  }
}

// JSONSchemaBench through the server (tests/fixtures/jsonschemabench: real schemas of five categories): each
// schema as response_format json_schema on /v1/chat/completions with the bundled model, four requests at a
// time. A schema is accepted (200) or refused with a 400 naming what it cannot take; every accepted one's
// output parses as JSON, and every completed one (finish_reason "stop", not "length") validates against its
// schema (python3-jsonschema). Prints coverage (accepted / sampled) per category. In ctest two schemas per
// category; ULTRA_JSB_ALL=1 runs all 40 of each and holds coverage to the JSONSchemaBench paper's best
// engine where its figure is known here (GitHub-Hard: Guidance 41%; GlaiveAI: every engine above 86%).
TEST_F(ServerTest, JsonSchemaBenchSampleValidates) {
  namespace fs = std::filesystem;
  const bool all = std::getenv("ULTRA_JSB_ALL") != nullptr;
  // Under the sanitizers one schema per category (the first of the two): each category's kinds of schema
  // still go through the grammar compiler, the masks and the server.
  const size_t per_category = all ? 40 : test::kSanitized ? 1 : 2;
  const fs::path root = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "jsonschemabench";
  const char* categories[] = {"Glaiveai2K", "Kubernetes", "Github_easy", "Github_medium", "Github_hard"};
  struct Job {
    int category;
    json schema;
  };
  std::vector<Job> jobs;
  for (int c = 0; c < 5; ++c) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(root / categories[c])) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    ASSERT_GE(files.size(), per_category) << categories[c];
    for (size_t k = 0; k < per_category; ++k) {
      std::ifstream f(files[k * files.size() / per_category]);
      jobs.push_back({c, json::parse(f)});
    }
  }
  struct Tally {
    int n = 0, accepted = 0, completed = 0;
  };
  std::vector<Tally> tally(5);
  std::vector<std::string> lines;  // {"schema", "doc"} of the completed outputs
  std::mutex m;
  std::atomic<size_t> next{0};
  const auto worker = [&] {
    auto c = client();
    for (size_t j; (j = next++) < jobs.size();) {
      const json body = {
          {"messages", json::array({{{"role", "user"}, {"content", "Write the JSON document."}}})},
          {"response_format",
           {{"type", "json_schema"}, {"json_schema", {{"name", "doc"}, {"schema", jobs[j].schema}}}}},
          {"max_tokens", 160},
          {"temperature", 0.7},
          {"seed", (int)j}};
      auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
      std::lock_guard lk(m);
      Tally& t = tally[(size_t)jobs[j].category];
      ++t.n;
      ASSERT_TRUE(r) << j;
      const json reply = json::parse(r->body, nullptr, false);
      if (r->status == 400) {  // refused, naming the cause
        EXPECT_FALSE(reply["error"]["message"].get<std::string>().empty()) << r->body;
        continue;
      }
      ASSERT_EQ(r->status, 200) << r->body;
      ++t.accepted;
      const std::string text = reply["choices"][0]["message"]["content"];
      if (reply["choices"][0]["finish_reason"] != "stop") continue;
      ++t.completed;
      const json doc = json::parse(text, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << text;
      lines.push_back(json({{"schema", jobs[j].schema}, {"doc", doc}}).dump());
    }
  };
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  std::printf("[jsonschemabench via the server] category        sampled accepted completed\n");
  for (int c = 0; c < 5; ++c)
    std::printf("[jsonschemabench via the server] %-15s %7d %7.1f%% %9d\n", categories[c], tally[(size_t)c].n,
                100.0 * tally[(size_t)c].accepted / std::max(1, tally[(size_t)c].n),
                tally[(size_t)c].completed);
  if (all) {
    EXPECT_GE(tally[0].accepted, 0.86 * tally[0].n) << "GlaiveAI";
    EXPECT_GE(tally[4].accepted, 0.41 * tally[4].n) << "GitHub-Hard";
  }
  if (!test::have_python_jsonschema())
    GTEST_SKIP() << "python3-jsonschema is not installed: tools/install-deps.sh";
  const test::TmpDir dir("ultra_server_jsb");
  const fs::path cases = dir.path() / "cases.jsonl";
  {
    std::ofstream out(cases);
    for (const std::string& l : lines) out << l << "\n";
  }
  test::expect_all_valid(cases, (int)lines.size(), dir.path());
}

TEST_F(ServerTest, DisconnectFreesTheSlot) {
  const auto before = metrics();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)env->port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, (sockaddr*)&a, sizeof a), 0);
  const std::string body =
      json{{"prompt", "Once"}, {"max_tokens", 200}, {"ignore_eos", true}, {"stream", true}}.dump();
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + std::string(kKey) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
      body;
  ASSERT_EQ(write(fd, req.data(), req.size()), (ssize_t)req.size());
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof buf);
    ASSERT_GT(n, 0);
    got.append(buf, (size_t)n);
  }
  close(fd);
  std::map<std::string, double> m;
  for (int i = 0; i < 200; ++i) {
    m = metrics();
    if (m["ultra_busy_slots"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(m["ultra_busy_slots"], 0);
  EXPECT_LT(m["ultra_generated_tokens_total"] - before.at("ultra_generated_tokens_total"), 200);
}

TEST_F(ServerTest, TokenizeRoundTrip) {
  const std::string text = "Hello world, the little dog";
  json t = post("/tokenize", {{"content", text}});
  ASSERT_TRUE(t["tokens"].is_array());
  EXPECT_FALSE(t["tokens"].empty());
  json d = post("/detokenize", {{"tokens", t["tokens"]}});
  EXPECT_EQ(d["content"], text);
}

TEST_F(ServerTest, MetricsCountWhatWasServed) {
  const auto before = metrics();
  const auto t0 = std::chrono::steady_clock::now();
  json r = post("/v1/completions", {{"prompt", "The sun"}, {"max_tokens", 4}, {"ignore_eos", true}});
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto after = metrics();
  // Time to first token: one more observation, within the request's wall time; cumulative buckets.
  const std::string h = "ultra_time_to_first_token_seconds";
  EXPECT_EQ(after.at(h + "_count") - before.at(h + "_count"), 1);
  const double ttft = after.at(h + "_sum") - before.at(h + "_sum");
  EXPECT_GT(ttft, 0);
  EXPECT_LE(ttft, wall);
  EXPECT_EQ(after.at(h + "_bucket{le=\"+Inf\"}"), after.at(h + "_count"));
  double prev = 0;
  int n_buckets = 0;
  for (const auto& [k, v] : after)
    if (k.rfind(h + "_bucket{le=\"", 0) == 0 && k.find("+Inf") == std::string::npos) ++n_buckets;
  EXPECT_EQ(n_buckets, 11);
  for (const char* le :
       {"0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"}) {
    const double v = after.at(h + "_bucket{le=\"" + le + "\"}");
    EXPECT_GE(v, prev) << le;
    prev = v;
  }
  EXPECT_EQ(after.at("ultra_requests_total") - before.at("ultra_requests_total"), 1);
  EXPECT_EQ(after.at("ultra_prompt_tokens_total") - before.at("ultra_prompt_tokens_total"),
            r["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(after.at("ultra_generated_tokens_total") - before.at("ultra_generated_tokens_total"), 4);
  EXPECT_EQ(after.at("ultra_busy_slots"), 0);
  EXPECT_EQ(after.at("ultra_queue_depth"), 0);
  json models = json::parse(client().Get("/v1/models")->body);
  EXPECT_EQ(models["object"], "list");
}

// Greedy reference tokens of a prompt with the log-softmax of each token's logits, in double precision.
struct LogprobRef {
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> logsoftmax;  // [token][vocab]
};
LogprobRef logprob_reference(const std::string& prompt, int n) {
  const Tokenizer& tok = *env->model.tokenizer();
  Context ctx(env->model, {.n_ctx = kCtx, .n_slots = 1, .n_threads = 2});
  ctx.set_sampling(0, SamplingParams::greedy());
  LogprobRef ref;
  generate(ctx, tok.encode(prompt, true, true), {.n_predict = n, .ignore_eos = true},
           [&](int32_t t, Context& c, int row) {
             const auto l = c.logits(row);
             const int nv = c.n_sample_vocab();
             double mx = -INFINITY, sum = 0;
             for (int i = 0; i < nv; ++i) mx = std::max(mx, (double)l[i]);
             for (int i = 0; i < nv; ++i) sum += std::exp((double)l[i] - mx);
             std::vector<double> ls(nv);
             for (int i = 0; i < nv; ++i) ls[i] = (double)l[i] - mx - std::log(sum);
             ref.tokens.push_back(t);
             ref.logsoftmax.push_back(std::move(ls));
             return true;
           });
  return ref;
}

// The ids of the k largest values, largest first (ties: lower id first).
std::vector<int32_t> top_ids(const std::vector<double>& v, int k) {
  std::vector<int32_t> ids(v.size());
  for (size_t i = 0; i < v.size(); ++i) ids[i] = (int32_t)i;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  ids.resize(k);
  return ids;
}

// logprobs on /v1/completions (an integer: the alternatives) in OpenAI's legacy shape and on
// /v1/chat/completions (logprobs: true, top_logprobs) in the chat shape, plain and streamed: the values are
// the log-softmax of the logits (computed here in double from a context of the test's own), the tokens are
// the text's pieces with their offsets, and a stop string drops the tokens that lie wholly inside it.
TEST_F(ServerTest, Logprobs) {
  const Tokenizer& tok = *env->model.tokenizer();
  const int n = 8;
  const LogprobRef ref = logprob_reference(kPrompts[2], n);
  json r = post("/v1/completions", {{"prompt", kPrompts[2]},
                                    {"max_tokens", n},
                                    {"temperature", 0},
                                    {"ignore_eos", true},
                                    {"logprobs", 3}});
  const std::string text = r["choices"][0]["text"];
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r;
  ASSERT_EQ(lp["tokens"].size(), (size_t)n) << lp;
  std::string concat;
  for (int i = 0; i < n; ++i) {
    const std::string piece(tok.token_to_piece(ref.tokens[i]));
    EXPECT_EQ(lp["tokens"][i], piece) << i;
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), concat.size()) << i;
    concat += piece;
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), ref.logsoftmax[i][ref.tokens[i]], 1e-3) << i;
    const json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 3u) << top;
    for (int32_t id : top_ids(ref.logsoftmax[i], 3)) {
      const std::string p(tok.token_to_piece(id));
      ASSERT_TRUE(top.contains(p)) << i << " " << p << " " << top;
      EXPECT_NEAR(top[p].get<double>(), ref.logsoftmax[i][id], 1e-3);
    }
  }
  EXPECT_EQ(concat, text);

  // Chat: the greedy token is the best alternative, with its log-probability; streamed chunks carry the
  // same entries as the whole answer.
  const json msgs = json::array({{{"role", "user"}, {"content", "Good morrow!"}}});
  const json body = {{"messages", msgs},   {"max_tokens", 6},  {"temperature", 0},
                     {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 2}};
  r = post("/v1/chat/completions", body);
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 6u) << r;
  concat.clear();
  for (const json& e : content) {
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["token"], e["top_logprobs"][0]["token"]);
    EXPECT_EQ(e["logprob"], e["top_logprobs"][0]["logprob"]);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
    std::string bytes;
    for (const json& b : e["bytes"]) bytes += (char)b.get<int>();
    EXPECT_EQ(bytes, e["token"].get<std::string>());
    concat += bytes;
  }
  EXPECT_EQ(concat, r["choices"][0]["message"]["content"]);
  json sbody = body;
  sbody["stream"] = true;
  auto c = client();
  auto s = c.Post("/v1/chat/completions", sbody.dump(), "application/json");
  ASSERT_TRUE(s);
  json streamed = json::array();
  for (const auto& ev : sse_events(s->body)) {
    if (ev == "[DONE]") continue;
    const json lpj = json::parse(ev)["choices"][0]["logprobs"];
    if (lpj.is_object())
      for (const json& e : lpj["content"]) streamed.push_back(e);
  }
  ASSERT_EQ(streamed.size(), content.size());
  for (size_t i = 0; i < content.size(); ++i) {
    EXPECT_EQ(streamed[i]["token"], content[i]["token"]);
    EXPECT_NEAR(streamed[i]["logprob"].get<double>(), content[i]["logprob"].get<double>(), 1e-4);
  }

  // A stop string: the listed tokens cover the text, and the last one starts inside it.
  const std::string full = reference(kPrompts[1], 24);
  const std::string stop = full.substr(6, 4);
  r = post(
      "/v1/completions",
      {{"prompt", kPrompts[1]}, {"max_tokens", 24}, {"temperature", 0}, {"stop", stop}, {"logprobs", 0}});
  const std::string cut = r["choices"][0]["text"];
  ASSERT_EQ(cut, full.substr(0, full.find(stop)));
  std::string all;
  for (const json& t : r["choices"][0]["logprobs"]["tokens"]) all += t.get<std::string>();
  EXPECT_EQ(all.substr(0, cut.size()), cut);
  EXPECT_LT(r["choices"][0]["logprobs"]["text_offset"].back().get<size_t>(), cut.size());
  EXPECT_TRUE(r["choices"][0]["logprobs"]["top_logprobs"][0].empty());

  // Without logprobs: null; bad values: 400 naming the field.
  r = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}});
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  json e = post("/v1/chat/completions", {{"messages", msgs}, {"top_logprobs", 2}}, 400);
  EXPECT_EQ(e["error"]["param"], "top_logprobs");
  e = post("/v1/chat/completions", {{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 21}}, 400);
  EXPECT_EQ(e["error"]["param"], "top_logprobs");
  e = post("/v1/completions", {{"prompt", "x"}, {"logprobs", true}}, 400);
  EXPECT_EQ(e["error"]["param"], "logprobs");
  e = post("/v1/chat/completions", {{"messages", msgs}, {"logprobs", 3}}, 400);
  EXPECT_EQ(e["error"]["param"], "logprobs");
}

// Prefix reuse: the second turn of a chat starts with the first turn's prompt and reply, which a free slot
// holds: it is served from that slot's cache (usage.prompt_tokens_details.cached_tokens, /metrics), and
// gives the same reply as the same request with cache_prompt false (prefilled from scratch).
TEST_F(ServerTest, PrefixReuseAcrossTurns) {
  json msgs = json::array({{{"role", "user"}, {"content", "Good morrow, fair lady!"}}});
  const json first = post("/v1/chat/completions",
                          {{"messages", msgs}, {"max_tokens", 12}, {"temperature", 0}, {"stop", "\n\n"}});
  const int n1 = first["usage"]["prompt_tokens"];
  msgs.push_back({{"role", "assistant"}, {"content", first["choices"][0]["message"]["content"]}});
  msgs.push_back({{"role", "user"}, {"content", "What news from Mantua?"}});
  const json body = {{"messages", msgs}, {"max_tokens", 12}, {"temperature", 0}};
  const auto before = metrics();
  const json second = post("/v1/chat/completions", body);
  const auto after = metrics();
  const int cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, n1) << second;
  EXPECT_LT(cached, second["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(after.at("ultra_prompt_tokens_cached_total") - before.at("ultra_prompt_tokens_cached_total"),
            cached);
  json fresh_body = body;
  fresh_body["cache_prompt"] = false;
  const json fresh = post("/v1/chat/completions", fresh_body);
  EXPECT_EQ(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(fresh["choices"][0]["message"]["content"], second["choices"][0]["message"]["content"]);
  EXPECT_EQ(fresh["usage"]["prompt_tokens"], second["usage"]["prompt_tokens"]);
  // The same prompt again: everything but its last token comes from the cache.
  const json again = post("/v1/chat/completions", body);
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"],
            second["usage"]["prompt_tokens"].get<int>() - 1);
  EXPECT_EQ(again["choices"][0]["message"]["content"], second["choices"][0]["message"]["content"]);
}

// The bundled model with a sliding window of 8, shorter than the prompts: greedy completions equal
// generate()'s, and a prompt that extends an earlier one (its prefix reused from the cache, the rest
// prefilled past the window) gives what it gives with cache_prompt off.
TEST_F(ServerTest, SlidingWindowShorterThanThePrompt) {
  const test::TmpDir tmp("ultra_server_swa");
  const std::string path = tmp.file("target-swa8.gguf");
  test::windowed_gguf(model_path(), path, 8);
  struct Swap {  // the suite's server back in place whatever happens
    Env* saved = env;
    ~Swap() {
      stop_env(env);
      env = saved;
    }
  } swap;
  env = start_env(path);
  const std::string p1 = "Once upon a time, in a small town by the sea, there lived a girl named Lily who";
  const json first = post("/v1/completions", {{"prompt", p1}, {"max_tokens", 16}, {"temperature", 0}});
  EXPECT_GT(first["usage"]["prompt_tokens"].get<int>(), 8);
  const std::string text1 = first["choices"][0]["text"];
  EXPECT_EQ(text1, reference(p1, 16));
  EXPECT_NE(text1, reference(p1, 16, &swap.saved->model));  // the window changes the continuation
  const std::string p2 = p1 + text1 + " Then one day";
  const json second = post("/v1/completions", {{"prompt", p2}, {"max_tokens", 16}, {"temperature", 0}});
  EXPECT_GE(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            first["usage"]["prompt_tokens"].get<int>());
  const json fresh = post("/v1/completions",
                          {{"prompt", p2}, {"max_tokens", 16}, {"temperature", 0}, {"cache_prompt", false}});
  EXPECT_EQ(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(second["choices"][0]["text"], fresh["choices"][0]["text"]);
  EXPECT_EQ(second["choices"][0]["text"], reference(p2, 16));
}

// The official openai npm package (tests/npm: `npm install` there) against the server: a chat completion,
// the same streamed (with usage), a legacy completion with logprobs, and the client's error for a refused
// request. Skipped, saying why, when node or the package is missing.
// Runs tests/npm/SCRIPT against the server: "" and its output, or why it cannot run (node or the openai
// package missing).
std::string node_client(const char* script, std::string& out, const std::string& args = "") {
  const std::filesystem::path dir = std::filesystem::path(ULTRA_SOURCE_DIR) / "tests" / "npm";
  if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not installed";
  if (!std::filesystem::exists(dir / "node_modules" / "openai" / "package.json"))
    return "the openai npm package is missing: run `npm install` in tests/npm";
  const std::string cmd = "timeout 60 node " + (dir / script).string() +
                          " http://127.0.0.1:" + std::to_string(env->port) + "/v1 " + kKey + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  return "";
}

TEST_F(ServerTest, OfficialOpenAiClient) {
  std::string out;
  if (const std::string skip = node_client("openai_client.mjs", out); !skip.empty()) GTEST_SKIP() << skip;
  const json j = json::parse(out);

  // What the client got equals what a plain HTTP client gets (greedy).
  const json msgs = json::array({{{"role", "user"}, {"content", "Good morrow, fair lady!"}}});
  const json want =
      post("/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(j["chat"]["object"], "chat.completion");
  EXPECT_EQ(j["chat"]["model"], "bundled");
  EXPECT_EQ(j["chat"]["role"], "assistant");
  EXPECT_EQ(j["chat"]["content"], want["choices"][0]["message"]["content"]);
  EXPECT_EQ(j["chat"]["finish_reason"], want["choices"][0]["finish_reason"]);
  // Usage but the cached prompt tokens, which depend on what the slots held before (prefix reuse).
  const auto counts = [](json u) {
    u.erase("prompt_tokens_details");
    return u;
  };
  EXPECT_EQ(counts(j["chat"]["usage"]), counts(want["usage"]));
  EXPECT_EQ(j["stream"]["content"], j["chat"]["content"]);
  EXPECT_EQ(j["stream"]["role"], "assistant");
  EXPECT_EQ(j["stream"]["finish_reason"], j["chat"]["finish_reason"]);
  EXPECT_EQ(counts(j["stream"]["usage"]), counts(j["chat"]["usage"]));
  EXPECT_GT(j["stream"]["chunks"].get<int>(), 2);
  EXPECT_EQ(j["completion"]["text"], reference("ROMEO:", 6));
  EXPECT_EQ(j["completion"]["logprobs"]["tokens"].size(), 6u);
  EXPECT_EQ(j["completion"]["usage"]["completion_tokens"], 6);
  EXPECT_EQ(j["error"]["status"], 400);
  EXPECT_EQ(j["error"]["param"], "n");
}

// Tool calls as the official client sees them (tests/npm/openai_tools.mjs): a named call, a required call
// streamed and put together from its deltas, and the call sent back as history with its result; and the
// named and the streamed required call again through real templates of the families (llama.cpp's
// models/templates: Qwen2.5, Llama 3.1, Mistral Nemo, Hermes 3, Command R+) sent as the request's
// chat_template, each call written in its family's syntax, enforced by the grammar and parsed back. (Command
// R+'s template makes a 954-token prompt: the tool servers' context is 2048.)
TEST_F(ToolServerTest, OfficialOpenAiClientToolCalls) {
  std::string out;
  const char* const kTemplates[] = {
      "Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
      "mistralai-Mistral-Nemo-Instruct-2407.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
      "CohereForAI-c4ai-command-r-plus-tool_use.jinja"};
  // Under the sanitizers (~5x slower) the first template only: the same requests through the same server
  // code (test_tool_calls parses every family's syntax there); all five run in the normal build.
  const size_t step = test::kSanitized ? std::size(kTemplates) : 1;
  std::string args;
  for (size_t i = 0; i < std::size(kTemplates); i += step)
    args +=
        " " + (std::filesystem::path(ULTRA_SOURCE_DIR) / "tests/fixtures/templates" / kTemplates[i]).string();
  if (const std::string skip = node_client("openai_tools.mjs", out, args); !skip.empty())
    GTEST_SKIP() << skip;
  const json j = json::parse(out);
  const auto valid_day = [](const std::string& name, const std::string& arguments) {
    const json a = json::parse(arguments, nullptr, false);
    return name == "set_day" && a.is_object() && a.size() == 1 &&
           (a["day"] == "mon" || a["day"] == "tue" || a["day"] == "sun");
  };
  EXPECT_EQ(j["named"]["finish_reason"], "tool_calls") << j;
  EXPECT_TRUE(j["named"]["message"]["content"].is_null()) << j;
  ASSERT_EQ(j["named"]["message"]["tool_calls"].size(), 1u) << j;
  const json& c = j["named"]["message"]["tool_calls"][0];
  EXPECT_EQ(c["type"], "function");
  EXPECT_TRUE(valid_day(c["function"]["name"], c["function"]["arguments"])) << j;
  EXPECT_EQ(j["stream"]["finish_reason"], "tool_calls") << j;
  EXPECT_EQ(j["stream"]["content"], "") << j;
  ASSERT_EQ(j["stream"]["calls"].size(), 1u) << j;
  EXPECT_TRUE(valid_day(j["stream"]["calls"][0]["name"], j["stream"]["calls"][0]["arguments"])) << j;
  EXPECT_FALSE(j["stream"]["calls"][0]["id"].get<std::string>().empty());
  EXPECT_EQ(j["followup"]["finish_reason"], "length") << j;
  EXPECT_GT(j["followup"]["usage"]["prompt_tokens"].get<int>(), 0);
  for (size_t i = 0; i < std::size(kTemplates); i += step) {
    const char* t = kTemplates[i];
    SCOPED_TRACE(t);
    ASSERT_TRUE(j["templates"].contains(t)) << j;
    const json& r = j["templates"][t];
    EXPECT_EQ(r["named"]["finish_reason"], "tool_calls") << r;
    ASSERT_EQ(r["named"]["message"]["tool_calls"].size(), 1u) << r;
    const json& f = r["named"]["message"]["tool_calls"][0]["function"];
    EXPECT_TRUE(valid_day(f["name"], f["arguments"])) << r;
    EXPECT_EQ(r["stream"]["finish_reason"], "tool_calls") << r;
    ASSERT_EQ(r["stream"]["calls"].size(), 1u) << r;
    EXPECT_TRUE(valid_day(r["stream"]["calls"][0]["name"], r["stream"]["calls"][0]["arguments"])) << r;
  }
}

// A full queue: with one slot busy and the one queue entry taken, the next request gets 503 with
// Retry-After and an OpenAI-shaped error; the queued request is then served.
TEST(ServerQueue, FullQueueGets503WithRetryAfter) {
  if (!std::filesystem::exists(model_path())) GTEST_SKIP() << "bundled model missing";
  const Model model = Model::load(model_path());
  ContextParams cp;
  cp.n_ctx = kCtx;
  cp.n_slots = 1;
  cp.n_threads = 1;
  auto sched = std::make_shared<server::Scheduler>(model, cp, /*max_queue=*/1);
  server::Server srv(server::ServerOptions{});
  const int port = srv.bind("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  srv.attach(sched);
  std::thread th([&] { srv.listen(); });
  const auto metric = [&](const std::string& name) {
    httplib::Client c("127.0.0.1", port);
    auto r = c.Get("/metrics");
    if (!r) return -1.0;
    const size_t at = r->body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(r->body.substr(at + name.size() + 2));
  };
  const auto wait_for = [&](const std::string& name, double v) {
    for (int i = 0; i < 2000 && metric(name) != v; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return metric(name) == v;
  };
  const std::string long_req = json{{"prompt", "ROMEO:"}, {"max_tokens", 240}, {"ignore_eos", true}}.dump();
  std::vector<int> status(2, 0);
  std::vector<std::thread> ts;
  ts.emplace_back([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/completions", long_req, "application/json");
    status[0] = r ? r->status : -1;
  });
  ASSERT_TRUE(wait_for("ultra_busy_slots", 1));
  ts.emplace_back([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/completions", R"({"prompt": "JULIET:", "max_tokens": 2})", "application/json");
    status[1] = r ? r->status : -1;
  });
  ASSERT_TRUE(wait_for("ultra_queue_depth", 1));
  httplib::Client c("127.0.0.1", port);
  auto r = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  const json e = json::parse(r->body);
  EXPECT_EQ(e["error"]["code"], "queue_full") << e;
  EXPECT_EQ(metric("ultra_busy_slots"), 1) << "the first request ended before the queue was full";
  for (auto& t : ts) t.join();
  EXPECT_EQ(status[0], 200);
  EXPECT_EQ(status[1], 200);
  EXPECT_TRUE(wait_for("ultra_busy_slots", 0));
  sched->shutdown();
  srv.stop();
  th.join();
}

std::string http_request(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer " + kKey +
         "\r\nContent-Type: application/json\r\n" + extra + "Content-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// Malformed and hostile requests get an answer (or a closed connection) and never take the server down:
// invalid UTF-8 and lone surrogates in JSON, 30000-deep nesting, a detokenized half character, a 100 KB
// header, garbage instead of HTTP, a body that stops short, slowloris-style stalled connections (others are
// still served meanwhile) and a body trickled in slowly (answered).
TEST_F(ServerTest, HostileInputsNeverCrash) {
  auto c = client();
  auto r = c.Post("/v1/completions", "{\"prompt\": \"\xff\xfe abc\"}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(json::parse(r->body)["error"].is_object());
  r = c.Post("/v1/completions", R"({"prompt": "\ud800 x"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  const std::string deep = "{\"prompt\": " + std::string(30000, '[') + std::string(30000, ']') + "}";
  r = c.Post("/v1/completions", deep, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  const std::string deep_msgs =
      "{\"messages\": [{\"role\": \"user\", \"content\": " + std::string(30000, '[') +
      std::string(30000, ']') + "}]}";
  r = c.Post("/v1/chat/completions", deep_msgs, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);

  // A token that is the first half of a character detokenizes to U+FFFD (valid JSON), not a 500.
  const Tokenizer& tok = *env->model.tokenizer();
  int32_t half = -1;
  for (int32_t id = 0; id < tok.n_vocab() && half < 0; ++id) {
    const std::string_view p = tok.token_to_piece(id);
    if (p.size() == 1 && (unsigned char)p[0] >= 0xC2 && (unsigned char)p[0] <= 0xF4) half = id;
  }
  ASSERT_GE(half, 0);
  json d = post("/detokenize", {{"tokens", {half}}});
  EXPECT_EQ(d["content"], "\xEF\xBF\xBD");

  {  // a 100 KB header
    RawConn k(env->port);
    ASSERT_GE(k.fd, 0);
    k.send_all(http_request("/v1/completions", R"({"prompt":"x","max_tokens":1})",
                            "X-Big: " + std::string(100 * 1024, 'a') + "\r\n"));
    const std::string out = k.read_all(true);
    EXPECT_TRUE(out.empty() || out.rfind("HTTP/1.1 4", 0) == 0) << out.substr(0, 200);
  }
  {  // not HTTP at all
    RawConn k(env->port);
    ASSERT_GE(k.fd, 0);
    k.send_all("\x16\x03\x01 GARBAGE \xff\r\n\r\n");
    const std::string out = k.read_all(true);
    EXPECT_TRUE(out.empty() || out.rfind("HTTP/1.1 4", 0) == 0) << out.substr(0, 200);
  }
  {  // a body that stops short: the connection is closed after the client half-closes
    RawConn k(env->port);
    ASSERT_GE(k.fd, 0);
    const std::string req = http_request("/v1/completions", R"({"prompt":"x","max_tokens":1})");
    k.send_all(req.substr(0, req.size() - 10));
    shutdown(k.fd, SHUT_WR);
    k.read_all();
  }
  // Stalled connections (headers never finished) hold a connection thread each, not the server.
  std::vector<std::unique_ptr<RawConn>> stalled;
  for (int i = 0; i < 4; ++i) {
    stalled.push_back(std::make_unique<RawConn>(env->port));
    stalled.back()->send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
  }
  const auto t0 = std::chrono::steady_clock::now();
  json ok = post("/v1/completions", {{"prompt", "ROMEO:"}, {"max_tokens", 2}});
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "length");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  {  // a body trickled in over ~0.3 s is answered
    RawConn k(env->port);
    ASSERT_GE(k.fd, 0);
    const std::string req = http_request(
        "/v1/completions", json{{"prompt", "ROMEO:"}, {"max_tokens", 2}, {"temperature", 0}}.dump());
    const size_t head = req.find("\r\n\r\n") + 4;
    k.send_all(req.substr(0, head));
    for (size_t i = head; i < req.size(); i += 8) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      k.send_all(req.substr(i, 8));
    }
    const std::string out = k.read_all();
    EXPECT_EQ(out.rfind("HTTP/1.1 200", 0), 0u) << out.substr(0, 300);
    EXPECT_NE(out.find("\"text_completion\""), std::string::npos);
  }
  stalled.clear();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// 1000 small requests one after another (one keep-alive connection): every one answered, /metrics counts
// them, no slot stays busy, and the process's resident memory does not grow with the count (checked
// without AddressSanitizer, whose quarantine holds freed memory on purpose; there 100 requests, and its leak
// check at exit sees what any count would leak).
TEST_F(ServerTest, ThousandSequentialRequestsLeakNothing) {
  const auto rss_kb = [] {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return 0L;
  };
  auto c = client();
  c.set_keep_alive(true);
  c.set_tcp_nodelay(true);  // else Nagle holds the body behind the headers for the server's delayed ACK
  const auto run = [&](int n, int first) {
    int good = 0;
    for (int i = 0; i < n; ++i) {
      const json body = {{"prompt", kPrompts[(first + i) % 8]}, {"max_tokens", 1}, {"seed", i}};
      const auto t0 = std::chrono::steady_clock::now();
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      good += r && r->status == 200;
      if (!(r && r->status == 200))  // what went wrong, for the failure message
        ADD_FAILURE() << "request " << first + i << ": "
                      << (r ? "status " + std::to_string(r->status) + " " + r->body
                            : "no response: " + httplib::to_string(r.error()))
                      << " after "
                      << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
    }
    return good;
  };
  EXPECT_EQ(run(50, 0), 50);  // warm-up: allocator pools, connection threads
  const long rss0 = rss_kb();
  const auto before = metrics();
  const int n = test::kSanitized ? 100 : 1000;
  EXPECT_EQ(run(n, 50), n);
  const auto after = metrics();
  const long rss1 = rss_kb();
  EXPECT_EQ(after.at("ultra_requests_total") - before.at("ultra_requests_total"), n);
  EXPECT_EQ(after.at("ultra_busy_slots"), 0);
  EXPECT_EQ(after.at("ultra_queue_depth"), 0);
  EXPECT_GE(after.at("ultra_generated_tokens_total") - before.at("ultra_generated_tokens_total"), n);
  if (!test::kSanitized)
    EXPECT_LT(rss1 - rss0, 4 * 1024) << "RSS grew from " << rss0 << " kB to " << rss1 << " kB";
  fmt::print("{} requests: RSS {} kB -> {} kB\n", n, rss0, rss1);
}

// 32 concurrent streams on a server with 32 slots: every stream is well formed and carries the greedy text
// generate() gives for its prompt alone; afterwards no slot is busy.
TEST(ServerLoad, ThirtyTwoConcurrentStreams) {
  if (!std::filesystem::exists(model_path())) GTEST_SKIP() << "bundled model missing";
  const Model model = Model::load(model_path());
  ContextParams cp;
  cp.n_ctx = kCtx;
  cp.n_slots = 32;
  cp.n_batch = 64;
  cp.n_threads = 2;
  auto sched = std::make_shared<server::Scheduler>(model, cp, 64);
  server::ServerOptions so;

  server::Server srv(so);
  const int port = srv.bind("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  srv.attach(sched);
  std::thread th([&] { srv.listen(); });
  std::vector<std::string> want(8);
  for (int i = 0; i < 8; ++i) want[i] = reference(kPrompts[i], 16, &model);
  std::vector<std::string> got(32), last(32);
  std::vector<std::thread> ts;
  for (int i = 0; i < 32; ++i)
    ts.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(120, 0);
      const json body = {
          {"prompt", kPrompts[i % 8]}, {"max_tokens", 16}, {"temperature", 0}, {"stream", true}};
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      if (!r || r->status != 200) {
        got[i] = r ? "status " + std::to_string(r->status) : "error " + httplib::to_string(r.error());
        return;
      }
      const auto ev = sse_events(r->body);
      for (const auto& e : ev)
        if (e != "[DONE]") got[i] += json::parse(e)["choices"][0]["text"].get<std::string>();
      last[i] = ev.empty() ? "" : ev.back();
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(got[i], want[i % 8]) << "stream " << i;
    EXPECT_EQ(last[i], "[DONE]") << "stream " << i;
  }
  EXPECT_EQ(sched->stats().busy_slots.load(), 0);
  EXPECT_GE(sched->stats().steps_total.load(), 16);
  EXPECT_LT(sched->stats().steps_total.load(), 32 * 16);  // the streams shared steps
  sched->shutdown();
  srv.stop();
  th.join();
}

// The stop-string filter shared by the scheduler and `ultra chat`: text that could begin a stop string is
// held back across pushes, the earliest complete stop string cuts the text, flush() gives back what was held.
TEST(StopStrings, HoldBackAndCut) {
  server::StopStrings a({"END", "\n\n"});
  EXPECT_EQ(a.push("abc E"), "abc ");
  EXPECT_EQ(a.push("N"), "");
  EXPECT_EQ(a.push("X"), "ENX");
  EXPECT_EQ(a.push("yy\n"), "yy");
  EXPECT_FALSE(a.stopped());
  EXPECT_EQ(a.push("\nzz"), "");
  EXPECT_TRUE(a.stopped());
  EXPECT_EQ(a.push("more"), "");
  server::StopStrings b({"bcd", "abcde"});
  EXPECT_EQ(b.push("xabcdef"), "x");  // the earliest start wins
  EXPECT_TRUE(b.stopped());
  server::StopStrings c({"world"});
  EXPECT_EQ(c.push("hello wor"), "hello ");
  EXPECT_EQ(c.flush(), "wor");
  server::StopStrings d({""});  // empty stop strings are ignored
  EXPECT_EQ(d.push("a"), "a");
  EXPECT_FALSE(d.stopped());
}

// Before a scheduler is attached (the model is loading) /health and the other routes answer 503.
TEST(ServerLoading, HealthIs503UntilReady) {
  server::Server srv(server::ServerOptions{});
  const int port = srv.bind("127.0.0.1", 0);
  ASSERT_GT(port, 0);
  std::thread th([&] { srv.listen(); });
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["status"], "loading");
  r = c.Post("/v1/completions", R"({"prompt":"x"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_FALSE(r->get_header_value("Retry-After").empty());
  srv.stop();
  th.join();
}

}  // namespace
