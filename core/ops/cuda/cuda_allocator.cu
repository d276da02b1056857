// allocate_cuda: device memory from a per-device caching allocator.
//
// cudaMalloc and cudaFree are slow (cudaFree also synchronises the device), and a training
// step allocates the same temporaries every time. So freed blocks are not returned to the
// driver: they go into a bin keyed by their rounded size, and the next request that rounds to
// the same size takes one back. Sizes are rounded up to one of four steps per power of two
// (2^k, 1.25 * 2^k, 1.5 * 2^k, 1.75 * 2^k), which wastes at most 25% of a block while keeping
// the number of distinct bins small enough that blocks really are reused.
//
// Reuse is stream-ordered only in the simple sense that matters here: every backend queues
// its work on one stream, so a block freed on the host while kernels still use it is reused
// only by work queued later on that same stream. Work on another stream (a communicator's)
// must keep the tensors it uses alive until it has completed: dist::Request holds every
// tensor given to a collective until the collective's completion event has fired, so a
// block comes back here only once that stream is done with it.
//
// When cudaMalloc runs out of memory, the cached blocks of that device are released and the
// allocation is tried once more. The cache lives for the whole process and is deliberately
// never destroyed: at exit the CUDA context may already be gone, and the driver reclaims
// everything anyway.
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/tensor/allocator.h"

namespace mantissa::core {
namespace {

constexpr size_t kMinBlock = 512;  // also keeps every block 512-byte aligned in size

// The smallest of {2^k, 1.25 2^k, 1.5 2^k, 1.75 2^k} (k >= 9) that holds `nbytes`.
size_t round_block_size(size_t nbytes) {
  if (nbytes <= kMinBlock) return kMinBlock;
  size_t power = kMinBlock;
  while (power * 2 < nbytes) power *= 2;
  const size_t step = power / 4;
  return (nbytes + step - 1) / step * step;
}

// Makes `device` current for the lifetime of the guard, then restores the previous one (the
// runtime's current device is per thread, and callers do not expect us to change it).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MANTISSA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) MANTISSA_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_ &&
        cudaSetDevice(previous_) != cudaSuccess) {
      std::fprintf(stderr, "mantissa: could not restore CUDA device %d\n", previous_);
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

class DeviceCache {
 public:
  explicit DeviceCache(int device) : device_(device) {}
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;

  // A block of at least `nbytes` (rounded, see round_block_size), from the cache if possible.
  void* acquire(size_t nbytes, size_t block_size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto bin = free_.find(block_size);
    if (bin != free_.end() && !bin->second.empty()) {
      void* block = bin->second.back();
      bin->second.pop_back();
      in_use_bytes_ += block_size;
      return block;
    }
    DeviceGuard guard(device_);
    void* block = nullptr;
    cudaError_t status = cudaMalloc(&block, block_size);
    if (status == cudaErrorMemoryAllocation) {
      // Out of memory is not a sticky error: clear it, give the cache back, try once more.
      cudaGetLastError();
      release_cached_locked();
      status = cudaMalloc(&block, block_size);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      std::ostringstream message;
      message << "allocate_cuda: cannot allocate " << nbytes << " bytes (block of " << block_size
              << ") on cuda:" << device_ << ": " << cudaGetErrorName(status) << " ("
              << cudaGetErrorString(status) << "); " << in_use_bytes_
              << " bytes are in use by tensors";
      if (status == cudaErrorMemoryAllocation) throw OutOfMemory(message.str());
      MANTISSA_FAIL(message.str());
    }
    in_use_bytes_ += block_size;
    return block;
  }

  // Called from Storage destructors: keeps the block for reuse, never throws.
  void release(void* block, size_t block_size) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_bytes_ -= block_size;
    try {
      free_[block_size].push_back(block);
    } catch (const std::bad_alloc&) {
      // The host is out of memory too; losing track of one device block is the least harm.
      std::fprintf(stderr, "mantissa: leaked a %zu-byte block on cuda:%d\n", block_size, device_);
    }
  }

 private:
  // Each block leaves the cache before it is freed, so a cudaFree that fails (and throws)
  // never leaves a freed block behind for acquire() to hand out.
  void release_cached_locked() {
    for (auto& [size, blocks] : free_) {
      while (!blocks.empty()) {
        void* block = blocks.back();
        blocks.pop_back();
        MANTISSA_CUDA_CHECK(cudaFree(block));
      }
    }
  }

  const int device_;
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // rounded size -> idle blocks
  size_t in_use_bytes_ = 0;
};

// One cache per device, created on first use (after checking that the device exists) and
// kept for the life of the process.
DeviceCache& cache_for(int device, size_t nbytes) {
  static std::mutex mutex;
  static auto* caches = new std::unordered_map<int, std::unique_ptr<DeviceCache>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto found = caches->find(device);
  if (found != caches->end()) return *found->second;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) cudaGetLastError();
  MANTISSA_CHECK(status == cudaSuccess && device >= 0 && device < count,
                 "allocate_cuda: cannot allocate "
                     << nbytes << " bytes on cuda:" << device << ": no such device ("
                     << (status == cudaSuccess ? count : 0) << " visible)");
  auto& cache = (*caches)[device];
  cache = std::make_unique<DeviceCache>(device);
  return *cache;
}

class CudaStorage final : public Storage {
 public:
  CudaStorage(size_t nbytes, int device)
      : nbytes_(nbytes),
        block_size_(round_block_size(nbytes)),
        device_(device),
        cache_(cache_for(device, nbytes)) {
    data_ = cache_.acquire(nbytes_, block_size_);
  }
  ~CudaStorage() override { cache_.release(data_, block_size_); }
  CudaStorage(const CudaStorage&) = delete;
  CudaStorage& operator=(const CudaStorage&) = delete;

  void* data() override { return data_; }
  size_t nbytes() const override { return nbytes_; }
  Device device() const override { return Device::cuda(device_); }

 private:
  size_t nbytes_;
  size_t block_size_;
  int device_;
  DeviceCache& cache_;
  void* data_ = nullptr;
};

}  // namespace

std::shared_ptr<Storage> allocate_cuda(size_t nbytes, int device_index) {
  return std::make_shared<CudaStorage>(nbytes, device_index);
}

}  // namespace mantissa::core
