#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/tensor/allocator.h"

namespace mantissa::core {
namespace {

class CpuStorage final : public Storage {
 public:
  explicit CpuStorage(size_t nbytes) : nbytes_(nbytes) {
    // aligned_alloc wants a size that is a multiple of the alignment (and non-zero).
    const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    data_ = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    if (data_ == nullptr) {
      throw OutOfMemory("allocate_cpu: out of host memory allocating " + std::to_string(nbytes) +
                        " bytes");
    }
  }
  ~CpuStorage() override { std::free(data_); }
  CpuStorage(const CpuStorage&) = delete;
  CpuStorage& operator=(const CpuStorage&) = delete;

  void* data() override { return data_; }
  size_t nbytes() const override { return nbytes_; }
  Device device() const override { return Device::cpu(); }

 private:
  void* data_ = nullptr;
  size_t nbytes_;
};

}  // namespace

std::shared_ptr<Storage> allocate_cpu(size_t nbytes) {
  return std::make_shared<CpuStorage>(nbytes);
}

}  // namespace mantissa::core
