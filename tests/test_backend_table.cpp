// test_backend_table — the automatic choice among a primitive's backends (src/primitives/
// backend_table.h) on a table of fake entries: the first entry that accepts runs, an entry that
// declines gives way to a later accepting one (and runs when none accepts), forcing an entry
// runs it even when it would decline, takes_first() applies the same rules to one entry, and the
// errors name every reason. Internal header: this
// suite includes src/ (the one test that does), because the real tables' choices depend on the
// machine (a GPU, an sm_90 one) while these rules must hold everywhere. Also the environment
// switches' parser (src/core/env.h), which the backends' study and benchmark switches share.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "core/env.h"
#include "backends/contract/backend_table.h"
#include "support/test_util.h"

namespace moekit {
namespace {

using ::testing::HasSubstr;
using test::caught;

// What each fake entry does is read from the call's arguments; the entries append their name to
// `ran` when they run.
struct FakeArgs {
  bool a_rejects = false, a_declines = false, b_rejects = false, b_syncs = false;
  std::vector<std::string>* ran = nullptr;
};

std::string a_rejects(const FakeArgs& x) { return x.a_rejects ? "a cannot" : ""; }
std::string a_declines(const FakeArgs& x) { return x.a_declines ? "b is faster here" : ""; }
void a_run(const FakeArgs& x) { x.ran->push_back("fake_a"); }
std::string b_rejects(const FakeArgs& x) { return x.b_rejects ? "b cannot" : ""; }
void b_run(const FakeArgs& x) { x.ran->push_back("fake_b"); }
bool b_syncs(const FakeArgs& x) { return x.b_syncs; }

constexpr detail::Backend<FakeArgs> kTable[] = {
    {"fake_a", a_rejects, a_run, a_declines},
    {"fake_b", b_rejects, b_run, nullptr, b_syncs},
};
const detail::RegisterBackendNames kRegister(kTable);

std::vector<std::string> choose(const Context& ctx, FakeArgs args) {
  std::vector<std::string> ran;
  args.ran = &ran;
  detail::dispatch<FakeArgs>("fake", kTable, ctx, args);
  return ran;
}

const std::vector<std::string> kA{"fake_a"}, kB{"fake_b"};

TEST(BackendTable, FirstAcceptingEntryRuns) {
  const Context ctx = Context::cpu();
  EXPECT_EQ(choose(ctx, {}), kA);
  EXPECT_EQ(choose(ctx, {.a_rejects = true}), kB);
}

TEST(BackendTable, DecliningEntryGivesWayToALaterAcceptingOne) {
  const Context ctx = Context::cpu();
  EXPECT_EQ(choose(ctx, {.a_declines = true}), kB);
  // Nothing later accepts: the declining entry runs after all (it can).
  EXPECT_EQ(choose(ctx, {.a_declines = true, .b_rejects = true}), kA);
}

// The host-sync rule (SPEC §1): an entry that would synchronise with the host (cuBLAS with device
// splits) is never the automatic choice — not even in place of a declining entry; the error
// when nothing else runs the call names the reason. Forced, it runs.
TEST(BackendTable, AnEntryThatSyncsIsNeverChosenAutomatically) {
  const Context ctx = Context::cpu();
  EXPECT_EQ(choose(ctx, {.a_declines = true, .b_syncs = true}), kA);
  auto e = caught([&] { choose(ctx, {.a_rejects = true, .b_syncs = true}); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), HasSubstr("fake_a: a cannot"));
  EXPECT_THAT(e->what(), HasSubstr("fake_b: it reads the device split counts on the host"));
  EXPECT_EQ(choose(ctx.with_backend("fake_b"), {.a_rejects = true, .b_syncs = true}), kB);
  // takes_first applies the rule to a single entry too.
  EXPECT_FALSE(detail::takes_first(kTable[1], ctx, FakeArgs{.b_syncs = true}));
  EXPECT_TRUE(detail::takes_first(kTable[1], ctx.with_backend("fake_b"), FakeArgs{.b_syncs = true}));
}

// bind() chooses before anything runs; the plan runs only when asked and records the backend.
TEST(BackendTable, BindChoosesFirstAndRunsOnlyWhenAsked) {
  const Context ctx = Context::cpu();
  std::vector<std::string> ran;
  detail::Plan plan = detail::bind<FakeArgs>("fake_bind", kTable, ctx, {.a_rejects = true, .ran = &ran});
  EXPECT_TRUE(ran.empty());
  EXPECT_EQ(last_backend(ctx, "fake_bind"), "");
  plan.run();
  EXPECT_EQ(ran, kB);
  EXPECT_EQ(last_backend(ctx, "fake_bind"), "fake_b");
  EXPECT_TRUE(caught([&] {
    detail::bind<FakeArgs>("fake_bind", kTable, ctx, {.a_rejects = true, .b_rejects = true, .ran = &ran});
  }));
  EXPECT_EQ(ran, kB) << "a bind that failed ran nothing";
}

TEST(BackendTable, ForcedEntryRunsEvenWhereItWouldDecline) {
  EXPECT_EQ(choose(Context::cpu().with_backend("fake_a"), {.a_declines = true}), kA);
  EXPECT_EQ(choose(Context::cpu().with_backend("fake_b"), {}), kB);
}

// takes_first: the rule a primitive uses to try one fused entry before composing others — taken
// when it accepts and does not decline, or when it is forced and accepts; never when another
// backend is forced.
TEST(BackendTable, TakesFirstFollowsTheSameRulesAsDispatch) {
  const detail::Backend<FakeArgs>& a = kTable[0];
  const Context cpu = Context::cpu();
  EXPECT_TRUE(detail::takes_first(a, cpu, {}));
  EXPECT_FALSE(detail::takes_first(a, cpu, {.a_rejects = true}));
  EXPECT_FALSE(detail::takes_first(a, cpu, {.a_declines = true}));
  EXPECT_TRUE(detail::takes_first(a, cpu.with_backend("fake_a"), {.a_declines = true}));
  EXPECT_FALSE(detail::takes_first(a, cpu.with_backend("fake_a"), {.a_rejects = true}));
  EXPECT_FALSE(detail::takes_first(a, cpu.with_backend("fake_b"), {}));
}

TEST(BackendTable, ErrorsNameTheReasons) {
  auto e = caught([] { choose(Context::cpu(), {.a_rejects = true, .b_rejects = true}); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), HasSubstr("fake: no backend accepts this call"));
  EXPECT_THAT(e->what(), HasSubstr("fake_a: a cannot"));
  EXPECT_THAT(e->what(), HasSubstr("fake_b: b cannot"));

  e = caught([] { choose(Context::cpu().with_backend("fake_a"), {.a_rejects = true}); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::Unsupported);
  EXPECT_THAT(e->what(), HasSubstr("forced backend 'fake_a' cannot run this call: a cannot"));
}

// detail::env_choice: the index of the value, -1 when unset or empty, an InvalidArgument error that names
// the variable, the values allowed and the one seen otherwise.
TEST(EnvChoice, IndexOfTheValueUnsetOrAnErrorNamingWhatIsAllowed) {
  constexpr const char* kName = "MOEKIT_TEST_ENV_CHOICE";
  ::unsetenv(kName);
  EXPECT_EQ(detail::env_choice(kName, {"coop", "wide"}), -1);
  ::setenv(kName, "", 1);
  EXPECT_EQ(detail::env_choice(kName, {"coop", "wide"}), -1);
  ::setenv(kName, "wide", 1);
  EXPECT_EQ(detail::env_choice(kName, {"coop", "wide"}), 1);
  ::setenv(kName, "coop", 1);
  EXPECT_EQ(detail::env_choice(kName, {"coop", "wide"}), 0);
  ::setenv(kName, "Wide", 1);
  const auto e = caught([&] { detail::env_choice(kName, {"coop", "wide"}); });
  ::unsetenv(kName);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind(), ErrorKind::InvalidArgument);
  EXPECT_THAT(e->what(), HasSubstr(kName));
  EXPECT_THAT(e->what(), HasSubstr("coop, wide or unset"));
  EXPECT_THAT(e->what(), HasSubstr("'Wide'"));
}

}  // namespace
}  // namespace moekit
