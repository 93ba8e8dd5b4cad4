// GPU inventory parsing, lending per job, and the GPU part of a rank's environment.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/job/env.hpp"
#include "runtime/cluster/gpu.hpp"

using namespace cafhvd;

TEST_CASE("--gpus lists: indices sorted, none, and clear errors") {
  CHECK(parse_gpu_list("3,0,1") == std::vector<int32_t>{0, 1, 3});
  CHECK(parse_gpu_list("none").empty());
  CHECK_THROWS_WITH(parse_gpu_list("0,,1"), "--gpus '0,,1': '' is not a device index (expected "
                                            "e.g. 0,1,2,3 or none)");
  CHECK_THROWS_WITH(parse_gpu_list("0,x"), doctest::Contains("'x' is not a device index"));
  CHECK_THROWS_WITH(parse_gpu_list("-1"), doctest::Contains("'-1' is not a device index"));
  CHECK_THROWS_WITH(parse_gpu_list("1,1"), "--gpus '1,1': device 1 is listed twice");
  CHECK_THROWS(parse_gpu_list(""));
}

TEST_CASE("nvidia-smi -L output gives the device indices") {
  std::string text = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5fd7a2f3-...)\n"
                     "  MIG 1g.5gb Device 0: (UUID: MIG-...)\n"
                     "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-0a1b...)\n"
                     "GPU 3: Tesla T4 (UUID: GPU-77...)";
  CHECK(parse_nvidia_smi_list(text) == std::vector<int32_t>{0, 1, 3});
  CHECK(parse_nvidia_smi_list("No devices were found\n").empty());
  CHECK(parse_nvidia_smi_list("").empty());
}

TEST_CASE("a pool lends disjoint devices per job and takes them back") {
  gpu_pool pool{{0, 1, 2, 3}};
  std::string why;
  auto a = pool.lend(1, 2, why);
  CHECK(a == std::vector<int32_t>{0, 1});
  auto b = pool.lend(2, 1, why);
  CHECK(b == std::vector<int32_t>{2});
  CHECK(pool.free() == std::vector<int32_t>{3});
  CHECK(pool.lend(3, 2, why).empty());
  CHECK(why == "2 GPUs wanted, 1 free (4 on this node, 3 lent to other jobs)");
  CHECK(pool.lent_to_others(1) == 1);
  pool.release(1);
  CHECK(pool.free() == std::vector<int32_t>{0, 1, 3});
  CHECK(pool.lend(3, 3, why) == std::vector<int32_t>{0, 1, 3});
  // more for the same job adds to what it holds
  pool.release(2);
  CHECK(pool.lend(3, 1, why) == std::vector<int32_t>{0, 1, 2, 3});
  pool.release(3);
  CHECK(pool.free().size() == 4);
  gpu_pool none;
  CHECK(none.lend(1, 1, why).empty());
  CHECK(why == "1 GPU wanted, 0 free (0 on this node, 0 lent to other jobs)");
}

TEST_CASE("GPU ranks get their devices, PCI order and NCCL; the user's values win") {
  rank_env_input in;
  in.cuda_visible_devices = "2,3";
  in.cpus_per_slot = 4;
  auto has = [](const std::vector<std::string>& env, const std::string& kv) {
    return std::count(env.begin(), env.end(), kv) == 1;
  };
  auto env = build_rank_env(in);
  CHECK(has(env, "CUDA_VISIBLE_DEVICES=2,3"));
  CHECK(has(env, "CUDA_DEVICE_ORDER=PCI_BUS_ID"));
  CHECK(has(env, "HOROVOD_GPU_OPERATIONS=NCCL"));
  CHECK(has(env, "HOROVOD_CPU_OPERATIONS=gloo"));
  CHECK(has(env, "OMP_NUM_THREADS=4"));
  in.base = {"HOROVOD_GPU_OPERATIONS=GLOO", "OMP_NUM_THREADS=1", "CUDA_DEVICE_ORDER=FASTEST_FIRST"};
  in.extra = {"CUDA_VISIBLE_DEVICES=7"};
  env = build_rank_env(in);
  CHECK(has(env, "HOROVOD_GPU_OPERATIONS=GLOO"));
  CHECK(has(env, "OMP_NUM_THREADS=1"));
  CHECK(has(env, "CUDA_DEVICE_ORDER=FASTEST_FIRST"));
  CHECK(has(env, "CUDA_VISIBLE_DEVICES=7")); // --env overrides
  // a CPU job sets none of it
  rank_env_input cpu;
  env = build_rank_env(cpu);
  for (auto& kv : env) {
    CHECK(kv.rfind("CUDA_", 0) != 0);
    CHECK(kv.rfind("HOROVOD_GPU_OPERATIONS", 0) != 0);
    CHECK(kv.rfind("OMP_NUM_THREADS", 0) != 0);
  }
}

TEST_CASE("the head node's CUDA_VISIBLE_DEVICES is never forwarded") {
  const char* envp[] = {"CUDA_VISIBLE_DEVICES=5", "PATH=/bin", "CUDA_HOME=/usr/local/cuda",
                        nullptr};
  auto fwd = forwardable_environment(const_cast<char**>(envp));
  CHECK(fwd == std::vector<std::string>{"PATH=/bin", "CUDA_HOME=/usr/local/cuda"});
}
