// A read-only memory mapping of a whole file (weights are read in place, never copied whole).
//
// A file truncated while mapped makes reads past its new end raise SIGBUS. The mapping guards
// against that: a handler finds the mapping that faulted, puts a zero page in place of the lost
// one (so the read completes) and marks the mapping lost; check_intact() then throws an error
// naming the file. Callers check after a pass over the weights (the CPU backend does after every
// forward), so a truncation ends the request with an error instead of killing the process.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace rl {

class MappedFile {
 public:
  // Throws rl::Error naming the path when the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

  // True once a read hit a page the file no longer has; check_intact() throws rl::Error then.
  bool lost_pages() const { return lost_pages_.load(std::memory_order_acquire); }
  void check_intact() const;

 private:
  int guard_slot_ = -1;  // this mapping's entry in the SIGBUS handler's table
  std::atomic<bool> lost_pages_{false};
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace rl
