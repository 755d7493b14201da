// Job detection (core/comm/job.h): every source (explicit TERSE_*, OpenMPI, SLURM) with a fake environment, SLURM's
// compressed hostlists, bad values named with their variable, and joinJob's token rules over a real store.
#include "core/comm/job.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "core/comm/transport.h"
#include "tests/comm/comm_test_util.h"

namespace terse::comm {
namespace {

using namespace std::chrono_literals;

// The InvalidArgument's message, or a failure when none is thrown.
std::string errorOf(const std::map<std::string, std::string>& vars) {
  try {
    detectJobEnv(testing::envOf(vars));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(JobEnv, NothingSetIsNoJob) {
  EXPECT_FALSE(detectJobEnv(testing::envOf({{"HOME", "/root"}})).has_value());
}

TEST(JobEnv, ExplicitTerseVariables) {
  const auto j = detectJobEnv(testing::envOf({{"TERSE_RANK", "2"},
                                              {"TERSE_WORLD_SIZE", "4"},
                                              {"TERSE_LOCAL_RANK", "0"},
                                              {"TERSE_LOCAL_WORLD_SIZE", "1"},
                                              {"TERSE_MASTER_ADDR", "10.0.0.1"},
                                              {"TERSE_MASTER_PORT", "29400"}}));
  ASSERT_TRUE(j);
  EXPECT_EQ(j->source, "terse");
  EXPECT_EQ(j->rank, 2);
  EXPECT_EQ(j->world_size, 4);
  EXPECT_EQ(j->local_rank, 0);
  EXPECT_EQ(j->local_world_size, 1);
  EXPECT_EQ(j->master_addr, "10.0.0.1");
  EXPECT_EQ(j->master_port, 29400);
  EXPECT_FALSE(j->host.empty());
  // Without local variables: one host, local = global.
  const auto k =
      detectJobEnv(testing::envOf({{"TERSE_RANK", "1"}, {"TERSE_WORLD_SIZE", "3"}, {"TERSE_MASTER_PORT", "5"}}));
  EXPECT_EQ(k->local_rank, 1);
  EXPECT_EQ(k->local_world_size, 3);
  EXPECT_EQ(k->master_addr, "127.0.0.1");
}

TEST(JobEnv, ExplicitVariablesWinOverSchedulers) {
  const auto j = detectJobEnv(testing::envOf({{"TERSE_RANK", "0"},
                                              {"TERSE_WORLD_SIZE", "2"},
                                              {"TERSE_MASTER_PORT", "1234"},
                                              {"SLURM_PROCID", "5"},
                                              {"SLURM_NTASKS", "8"},
                                              {"OMPI_COMM_WORLD_RANK", "3"},
                                              {"OMPI_COMM_WORLD_SIZE", "4"}}));
  EXPECT_EQ(j->source, "terse");
  EXPECT_EQ(j->world_size, 2);
}

TEST(JobEnv, BadExplicitValuesNameTheVariableAndValue) {
  EXPECT_NE(errorOf({{"TERSE_RANK", "two"}, {"TERSE_WORLD_SIZE", "4"}, {"TERSE_MASTER_PORT", "1"}})
                .find("TERSE_RANK='two' is not an integer"),
            std::string::npos);
  EXPECT_NE(errorOf({{"TERSE_RANK", "4"}, {"TERSE_WORLD_SIZE", "4"}, {"TERSE_MASTER_PORT", "1"}})
                .find("TERSE_RANK=4 is not below TERSE_WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(errorOf({{"TERSE_RANK", "0"}, {"TERSE_WORLD_SIZE", "0"}}).find("TERSE_WORLD_SIZE=0 is out of range"),
            std::string::npos);
  EXPECT_NE(errorOf({{"TERSE_RANK", "0"}, {"TERSE_WORLD_SIZE", "2"}, {"TERSE_MASTER_PORT", "70000"}})
                .find("TERSE_MASTER_PORT=70000 is out of range"),
            std::string::npos);
  EXPECT_NE(errorOf({{"TERSE_RANK", "0"}, {"TERSE_WORLD_SIZE", "2"}, {"TERSE_MASTER_PORT", "12x"}})
                .find("TERSE_MASTER_PORT='12x'"),
            std::string::npos);
  EXPECT_NE(errorOf({{"TERSE_RANK", "0"}}).find("TERSE_WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(errorOf({{"TERSE_RANK", "0"}, {"TERSE_WORLD_SIZE", "2"}}).find("TERSE_MASTER_PORT is not set"),
            std::string::npos);
  EXPECT_NE(errorOf({{"TERSE_RANK", "0"},
                     {"TERSE_WORLD_SIZE", "2"},
                     {"TERSE_MASTER_PORT", "9"},
                     {"TERSE_MASTER_ADDR", "host;rm -rf"}})
                .find("TERSE_MASTER_ADDR='host;rm -rf' is not a host name"),
            std::string::npos);
  EXPECT_NE(errorOf({{"TERSE_RANK", "1"},
                     {"TERSE_WORLD_SIZE", "4"},
                     {"TERSE_MASTER_PORT", "9"},
                     {"TERSE_LOCAL_RANK", "2"},
                     {"TERSE_LOCAL_WORLD_SIZE", "2"}})
                .find("TERSE_LOCAL_RANK=2 is not below TERSE_LOCAL_WORLD_SIZE=2"),
            std::string::npos);
}

TEST(JobEnv, OpenMpi) {
  const auto j = detectJobEnv(testing::envOf({{"OMPI_COMM_WORLD_RANK", "3"},
                                              {"OMPI_COMM_WORLD_SIZE", "4"},
                                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                              {"TERSE_MASTER_ADDR", "head"}}));
  ASSERT_TRUE(j);
  EXPECT_EQ(j->source, "openmpi");
  EXPECT_EQ(j->rank, 3);
  EXPECT_EQ(j->world_size, 4);
  EXPECT_EQ(j->local_rank, 1);
  EXPECT_EQ(j->local_world_size, 2);
  EXPECT_EQ(j->master_addr, "head");
  EXPECT_EQ(j->master_port, 29500);
  // Several hosts and no master address: refuse rather than rendezvous on each host's own loopback.
  EXPECT_NE(errorOf({{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("set TERSE_MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(errorOf({{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "4"}})
                .find("OMPI_COMM_WORLD_RANK=-1 is out of range"),
            std::string::npos);
}

TEST(JobEnv, Slurm) {
  const auto j = detectJobEnv(testing::envOf({{"SLURM_PROCID", "5"},
                                              {"SLURM_NTASKS", "8"},
                                              {"SLURM_LOCALID", "1"},
                                              {"SLURM_NODEID", "1"},
                                              {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                              {"SLURM_JOB_NODELIST", "node[01-04,07],gpu3"},
                                              {"SLURM_JOB_ID", "123456"}}));
  ASSERT_TRUE(j);
  EXPECT_EQ(j->source, "slurm");
  EXPECT_EQ(j->rank, 5);
  EXPECT_EQ(j->world_size, 8);
  EXPECT_EQ(j->local_rank, 1);
  EXPECT_EQ(j->local_world_size, 4);
  EXPECT_EQ(j->master_addr, "node01");
  EXPECT_EQ(j->master_port, kSlurmPortBase + 123456 % kSlurmPortSpan);
  // TERSE_MASTER_* override, and the step's node list wins over the job's.
  const auto k = detectJobEnv(testing::envOf({{"SLURM_PROCID", "0"},
                                              {"SLURM_NTASKS", "2"},
                                              {"SLURM_STEP_NODELIST", "gpu[7-8]"},
                                              {"SLURM_JOB_NODELIST", "node[01-04]"},
                                              {"SLURM_JOB_ID", "1"},
                                              {"TERSE_MASTER_PORT", "4000"}}));
  EXPECT_EQ(k->master_addr, "gpu7");
  EXPECT_EQ(k->master_port, 4000);
  EXPECT_NE(errorOf({{"SLURM_PROCID", "8"}, {"SLURM_NTASKS", "8"}, {"SLURM_NODELIST", "n1"}, {"SLURM_JOB_ID", "1"}})
                .find("SLURM_PROCID=8 is not below SLURM_NTASKS=8"),
            std::string::npos);
  EXPECT_NE(
      errorOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "node[03-01]"}, {"SLURM_JOB_ID", "1"}})
          .find("SLURM_NODELIST='node[03-01]' is not a SLURM hostlist: the range '03-01' runs backwards"),
      std::string::npos);
  EXPECT_NE(errorOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "n1"}, {"SLURM_JOB_ID", "x"}})
                .find("SLURM_JOB_ID='x'"),
            std::string::npos);
  EXPECT_NE(errorOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "n1"}}).find("SLURM_JOB_ID"),
            std::string::npos);
}

TEST(SlurmHostlist, ExpandsRangesListsPaddingAndSeveralGroups) {
  EXPECT_EQ(expandSlurmHostlist("node[01-04,07],gpu3"),
            (std::vector<std::string>{"node01", "node02", "node03", "node04", "node07", "gpu3"}));
  EXPECT_EQ(expandSlurmHostlist("n[8-10]"), (std::vector<std::string>{"n8", "n9", "n10"}));
  EXPECT_EQ(expandSlurmHostlist("n[08-10]"), (std::vector<std::string>{"n08", "n09", "n10"}));
  EXPECT_EQ(expandSlurmHostlist("r[1-2]-n[1,3]"), (std::vector<std::string>{"r1-n1", "r1-n3", "r2-n1", "r2-n3"}));
  EXPECT_EQ(expandSlurmHostlist("a-[1-2]b.x,c"), (std::vector<std::string>{"a-1b.x", "a-2b.x", "c"}));
  EXPECT_EQ(expandSlurmHostlist("single"), (std::vector<std::string>{"single"}));
  EXPECT_EQ(firstSlurmHost("node[01-04,07],gpu3"), "node01");
  EXPECT_EQ(firstSlurmHost("[5-6]x"), "5x");
  EXPECT_EQ(firstSlurmHost("gpu3,node[1-2]"), "gpu3");
}

TEST(SlurmHostlist, MalformedListsAreNamedErrors) {
  for (const char* bad :
       {"", "node[01-04", "node01]", "node[]", "node[a-b]", "n[1-2],,m", "n[2-1]", "n o", "n,", "n[1-2-3]"}) {
    try {
      expandSlurmHostlist(bad, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST='" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(firstSlurmHost(bad), InvalidArgument) << bad;
  }
  EXPECT_THROW(expandSlurmHostlist("n[0-99999999999]"), InvalidArgument);  // refused, not allocated
  EXPECT_EQ(firstSlurmHost("n[0-99999999999]"), "n0");
}

TEST(Loopback, Addresses) {
  EXPECT_TRUE(isLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(isLoopbackAddress("127.1.2.3"));
  EXPECT_TRUE(isLoopbackAddress("localhost"));
  EXPECT_TRUE(isLoopbackAddress("::1"));
  EXPECT_FALSE(isLoopbackAddress("10.0.0.1"));
  EXPECT_FALSE(isLoopbackAddress("node01"));
}

TEST(JoinJob, SeveralRanksWithoutATokenIsAClearError) {
  try {
    joinJob(1s, testing::envOf({{"TERSE_RANK", "1"}, {"TERSE_WORLD_SIZE", "2"}, {"TERSE_MASTER_PORT", "1"}}));
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("terse launch"), std::string::npos) << m;
    EXPECT_NE(m.find("TERSE_JOB_TOKEN"), std::string::npos) << m;
    EXPECT_NE(m.find(JobToken::kHowToMakeOne), std::string::npos) << m;
  }
  EXPECT_THROW(joinJob(1s, testing::envOf({{"TERSE_RANK", "1"},
                                           {"TERSE_WORLD_SIZE", "2"},
                                           {"TERSE_MASTER_PORT", "1"},
                                           {"TERSE_JOB_TOKEN", "short"}})),
               InvalidArgument);
  // What `openssl rand -hex 32` prints is random but not terse's format: refused before any connection, the variable
  // named, the token not shown.
  const std::string openssl_style = "4a6c8e0b2d4f6a8c0e2b4d6f8a0c2e4b9d1f3a5c7e9b0d2f4a6c8e0b2d4f6a8c";
  try {
    joinJob(1s, testing::envOf({{"TERSE_RANK", "1"},
                                {"TERSE_WORLD_SIZE", "2"},
                                {"TERSE_MASTER_PORT", "1"},
                                {"TERSE_JOB_TOKEN", openssl_style}}));
    FAIL() << "a token terse did not generate was accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("TERSE_JOB_TOKEN: the job token is 64 bare hexadecimal digits"), std::string::npos) << m;
    EXPECT_NE(m.find(JobToken::kHowToMakeOne), std::string::npos) << m;
    EXPECT_EQ(m.find(openssl_style.substr(0, 12)), std::string::npos) << m;
  }
}

TEST(JoinJob, SingleRankHostsItsOwnStore) {
  Job job = joinJob(2s, testing::envOf({}));
  EXPECT_EQ(job.env.world_size, 1);
  ASSERT_NE(job.server, nullptr);
  job.store->set("k", "v");
  EXPECT_EQ(job.store->get("k", 1s), "v");
}

TEST(JoinJob, RanksMeetThroughRankZerosStore) {
  // Rank 1 starts first and waits for rank 0's store; both then see each other's keys.
  TcpStoreServer probe(JobToken::generate(), {});
  const uint16_t port = probe.port();
  probe.stop();
  const std::string token = JobToken::generate().secret();
  auto env = [&](int rank) {
    return testing::envOf({{"TERSE_RANK", std::to_string(rank)},
                           {"TERSE_WORLD_SIZE", "2"},
                           {"TERSE_MASTER_ADDR", "127.0.0.1"},
                           {"TERSE_MASTER_PORT", std::to_string(port)},
                           {"TERSE_JOB_TOKEN", token}});
  };
  std::string seen_by_1;
  std::thread rank1([&] {
    Job j = joinJob(5s, env(1));
    EXPECT_EQ(j.server, nullptr);
    j.store->set("rank/1", "b");
    seen_by_1 = j.store->get("rank/0", 5s);
    j.store->add("done", 1);
  });
  std::this_thread::sleep_for(100ms);
  Job j0 = joinJob(5s, env(0));
  ASSERT_NE(j0.server, nullptr);
  EXPECT_EQ(j0.server->port(), port);
  j0.store->set("rank/0", "a");
  EXPECT_EQ(j0.store->get("rank/1", 5s), "b");
  rank1.join();
  EXPECT_EQ(seen_by_1, "a");
  EXPECT_EQ(j0.store->get("done", 1s), "1");
}

TEST(JoinJob, ExternalStoreNeedsAPortAndBadFlagsAreNamed) {
  EXPECT_THROW(joinJob(1s, testing::envOf({{"TERSE_STORE_EXTERNAL", "maybe"}})), InvalidArgument);
  try {
    joinJob(1s, testing::envOf({{"TERSE_STORE_EXTERNAL", "1"}}));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TERSE_MASTER_PORT"), std::string::npos) << e.what();
  }
  // With an external store, rank 0 only connects.
  const JobToken t =
      JobToken::fromString("terse-v1-cbccfbeb9a208ad35bcf85dd6722ad1d2e32a5de1d0f758c738084a962b61009-a25d10a2");
  TcpStoreServer external(t, {});
  Job j = joinJob(2s, testing::envOf({{"TERSE_STORE_EXTERNAL", "1"},
                                      {"TERSE_MASTER_PORT", std::to_string(external.port())},
                                      {"TERSE_JOB_TOKEN", t.secret()}}));
  EXPECT_EQ(j.server, nullptr);
  j.store->set("k", "v");
}

}  // namespace
}  // namespace terse::comm
