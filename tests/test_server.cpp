// `ultra serve`'s HTTP server, in process on a free loopback port with the bundled model, driven by
// cpp-httplib's client: greedy completions equal generate()'s (also 8 at once over 4 slots), SSE streams,
// stop strings, finish reasons, the OpenAI-shaped errors, a client leaving mid-stream, /tokenize, /metrics.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/server.h"
#include "ultra/generate.h"

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

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (env || !std::filesystem::exists(model_path())) return;
    env = new Env{Model::load(model_path()), nullptr, nullptr, {}, 0};
    ContextParams cp;
    cp.n_ctx = kCtx;
    cp.n_slots = 4;
    cp.n_batch = 64;  // small, so that prefill chunks share steps with decodes
    cp.n_threads = 2;
    env->sched = std::make_shared<server::Scheduler>(env->model, cp, 64);
    server::ServerOptions so;
    so.api_key = kKey;
    so.max_body = 64 * 1024;
    env->srv = std::make_unique<server::Server>(so);
    env->port = env->srv->bind("127.0.0.1", 0);
    env->srv->attach(env->sched);
    env->th = std::thread([] { env->srv->listen(); });
  }
  static void TearDownTestSuite() {
    if (!env) return;
    env->sched->shutdown();
    env->srv->stop();
    env->th.join();
    delete env;
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
std::string reference(const std::string& prompt, int n) {
  const Tokenizer& tok = *env->model.tokenizer();
  Context ctx(env->model, {.n_ctx = kCtx, .n_slots = 1, .n_threads = 2});
  ctx.set_sampling(0, SamplingParams::greedy());
  std::vector<int32_t> out;
  generate(ctx, tok.encode(prompt, true, true), {.n_predict = n}, [&](int32_t t, Context&, int) {
    if (!env->model.is_eog(t)) out.push_back(t);
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
  e = post("/v1/completions", {{"prompt", "x"}, {"n", 2}}, 400);
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
  json r = post("/v1/completions", {{"prompt", "The sun"}, {"max_tokens", 4}, {"ignore_eos", true}});
  const auto after = metrics();
  EXPECT_EQ(after.at("ultra_requests_total") - before.at("ultra_requests_total"), 1);
  EXPECT_EQ(after.at("ultra_prompt_tokens_total") - before.at("ultra_prompt_tokens_total"),
            r["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(after.at("ultra_generated_tokens_total") - before.at("ultra_generated_tokens_total"), 4);
  EXPECT_EQ(after.at("ultra_busy_slots"), 0);
  EXPECT_EQ(after.at("ultra_queue_depth"), 0);
  json models = json::parse(client().Get("/v1/models")->body);
  EXPECT_EQ(models["object"], "list");
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
