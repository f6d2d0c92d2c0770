// Reasoning apart from the answer (src/server/reasoning.h): the Think and Harmony syntaxes on whole outputs,
// the same results however the output is cut into streamed pieces, and the syntax detected from real
// templates (tests/fixtures/templates). The server's side is in test_server.cpp (ReasoningContent*).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/reasoning.h"

using namespace ultra::server;

namespace {

struct Want {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // (name, arguments)
};

// The whole output at once, and every way of cutting it in two and three pieces, give `want`.
void expect_split(std::string_view text, ReasoningSyntax syntax, bool in_thinking, const Want& want) {
  auto check = [&](const ReasoningSplit& got, const std::string& how) {
    EXPECT_EQ(got.reasoning, want.reasoning) << how;
    EXPECT_EQ(got.content, want.content) << how;
    ASSERT_EQ(got.calls.size(), want.calls.size()) << how;
    for (size_t i = 0; i < got.calls.size(); ++i) {
      EXPECT_EQ(got.calls[i].name, want.calls[i].first) << how;
      EXPECT_EQ(got.calls[i].arguments, want.calls[i].second) << how;
      EXPECT_TRUE(got.calls[i].id.starts_with("call_")) << how;
    }
  };
  check(split_reasoning(text, syntax, in_thinking), "whole");
  for (size_t a = 0; a <= text.size(); ++a)
    for (size_t b = a; b <= text.size(); b += (text.size() > 80 ? 7 : 1)) {
      ReasoningStream s(syntax, in_thinking);
      ReasoningSplit got;
      for (std::string_view piece : {text.substr(0, a), text.substr(a, b - a), text.substr(b)}) {
        ReasoningSplit p = s.push(piece);
        got.reasoning += p.reasoning;
        got.content += p.content;
        EXPECT_TRUE(p.calls.empty());  // calls come with finish()
      }
      ReasoningSplit f = s.finish();
      got.reasoning += f.reasoning;
      got.content += f.content;
      got.calls = std::move(f.calls);
      check(got, "cut at " + std::to_string(a) + ", " + std::to_string(b));
      if (::testing::Test::HasFailure()) return;
    }
}

TEST(Reasoning, ThinkBlock) {
  expect_split("<think>I should greet.</think>\n\nHello!", ReasoningSyntax::Think, false,
               {"I should greet.", "Hello!", {}});
  expect_split("\n <think>a < b</think>b", ReasoningSyntax::Think, false, {"a < b", "b", {}});
  // the prompt ended inside the block (DeepSeek R1): no opening tag in the output
  expect_split("plan: x</think> done", ReasoningSyntax::Think, true, {"plan: x", "done", {}});
  // unclosed: all reasoning (cut off at max_tokens while thinking)
  expect_split("<think>still thinking <", ReasoningSyntax::Think, false, {"still thinking <", "", {}});
  // a block later in the output is not reasoning; nor is text without one
  expect_split("Hi <think>x</think>", ReasoningSyntax::Think, false, {"", "Hi <think>x</think>", {}});
  expect_split("<thin", ReasoningSyntax::Think, false, {"", "<thin", {}});
  expect_split("", ReasoningSyntax::Think, false, {"", "", {}});
  expect_split("<think></think>", ReasoningSyntax::Think, false, {"", "", {}});
  // None: everything is content
  expect_split("<think>x</think>y", ReasoningSyntax::None, false, {"", "<think>x</think>y", {}});
}

TEST(Reasoning, HarmonyChannels) {
  const std::string out =
      "<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?";
  expect_split(out, ReasoningSyntax::Harmony, false,
               {"The user greets; answer briefly.", "Hello! How can I help?", {}});
  // <|return|> when the end token's text is kept; commentary without a recipient is answer text
  expect_split(
      "<|channel|>commentary<|message|>Looking it up.<|end|><|start|>assistant<|channel|>final"
      "<|message|>Done.<|return|>",
      ReasoningSyntax::Harmony, false, {"", "Looking it up.Done.", {}});
  // text outside any message is answer; white space between messages is dropped
  expect_split("plain text", ReasoningSyntax::Harmony, false, {"", "plain text", {}});
  expect_split(" plain text \n", ReasoningSyntax::Harmony, false, {"", " plain text \n", {}});
  expect_split("x\n<|channel|>final<|message|>y", ReasoningSyntax::Harmony, false, {"", "x\ny", {}});
  expect_split("<|channel|>analysis<|message|>a<|end|>\n<|start|>assistant<|channel|>final<|message|>b",
               ReasoningSyntax::Harmony, false, {"a", "b", {}});
  // cut off inside the analysis (max_tokens): reasoning only
  expect_split("<|channel|>analysis<|message|>thinking <|", ReasoningSyntax::Harmony, false,
               {"thinking <|", "", {}});
}

TEST(Reasoning, HarmonyToolCalls) {
  // the recipient in the channel's header, and in the role's
  expect_split(
      "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
      ReasoningSyntax::Harmony, false, {"Need the weather.", "", {{"get_weather", "{\"city\":\"Paris\"}"}}});
  expect_split("<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{\"a\":1,\"b\":2}",
               ReasoningSyntax::Harmony, false, {"", "", {{"add", "{\"a\":1,\"b\":2}"}}});
  // two calls in one output
  expect_split(
      "<|channel|>commentary to=functions.f<|message|>{}<|call|><|start|>assistant<|channel|>"
      "commentary to=functions.g<|message|>{\"x\":[1]}",
      ReasoningSyntax::Harmony, false, {"", "", {{"f", "{}"}, {"g", "{\"x\":[1]}"}}});
  // arguments that are not a JSON object stay text; a recipient that is not a function is not a call
  expect_split("<|channel|>commentary to=functions.f<|message|>{oops", ReasoningSyntax::Harmony, false,
               {"", "{oops", {}});
  expect_split("<|channel|>commentary to=browser.search<|message|>q", ReasoningSyntax::Harmony, false,
               {"", "q", {}});
}

std::string read_template(const std::string& name) {
  std::ifstream f(std::filesystem::path(ULTRA_SOURCE_DIR) / "tests/fixtures/templates" / name);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Reasoning, DetectedFromRealTemplates) {
  struct Case {
    const char* file;
    ReasoningSyntax want;
  };
  for (const Case& c : {Case{"openai-gpt-oss-120b.jinja", ReasoningSyntax::Harmony},
                        Case{"Qwen-Qwen3-0.6B.jinja", ReasoningSyntax::Think},
                        Case{"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ReasoningSyntax::Think},
                        Case{"Qwen-QwQ-32B.jinja", ReasoningSyntax::Think},
                        Case{"Qwen-Qwen2.5-7B-Instruct.jinja", ReasoningSyntax::None},
                        Case{"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ReasoningSyntax::None}}) {
    const std::string src = read_template(c.file);
    ASSERT_FALSE(src.empty()) << c.file;
    EXPECT_EQ(detect_reasoning(src), c.want)
        << c.file << ": " << reasoning_syntax_name(detect_reasoning(src));
  }
  EXPECT_EQ(detect_reasoning(""), ReasoningSyntax::None);
  EXPECT_TRUE(prompt_opens_thinking("<｜Assistant｜><think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<think>\n\n</think>\n\n"));  // Qwen3 with thinking off
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
}

}  // namespace
