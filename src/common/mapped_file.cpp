#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "common/error.h"

namespace rl {
namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

// The mappings the SIGBUS handler may repair, read lock-free by the handler.
struct GuardedRange {
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<std::atomic<bool>*> lost{nullptr};
};
constexpr int kMaxGuarded = 64;
GuardedRange g_guarded[kMaxGuarded];
struct sigaction g_previous_sigbus;
std::mutex g_guard_m;  // registration only; never taken in the handler

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t addr = (uintptr_t)info->si_addr;
  const uintptr_t page = (uintptr_t)::sysconf(_SC_PAGESIZE);
  for (GuardedRange& r : g_guarded) {
    if (addr < r.begin.load(std::memory_order_acquire) || addr >= r.end.load(std::memory_order_acquire)) continue;
    void* at = (void*)(addr & ~(page - 1));
    if (::mmap(at, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) break;
    if (auto* lost = r.lost.load(std::memory_order_acquire)) lost->store(true, std::memory_order_release);
    return;  // the read is retried on the zero page
  }
  // Not a guarded mapping: what would have happened without this handler happens.
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    if (g_previous_sigbus.sa_sigaction) return g_previous_sigbus.sa_sigaction(sig, info, context);
  } else if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN) {
    return g_previous_sigbus.sa_handler(sig);
  }
  ::signal(SIGBUS, SIG_DFL);  // returning re-runs the faulting read, which now kills the process
}

// Registers [data, data + size); -1 when the table is full (the mapping is then unguarded).
int guard(const uint8_t* data, size_t size, std::atomic<bool>* lost) {
  std::lock_guard<std::mutex> l(g_guard_m);
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return ::sigaction(SIGBUS, &sa, &g_previous_sigbus) == 0;
  }();
  if (!installed) return -1;
  for (int i = 0; i < kMaxGuarded; i++) {
    if (g_guarded[i].end.load() != 0) continue;
    g_guarded[i].lost.store(lost);
    g_guarded[i].begin.store((uintptr_t)data);
    g_guarded[i].end.store((uintptr_t)data + size, std::memory_order_release);
    return i;
  }
  return -1;
}

void unguard(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> l(g_guard_m);
  g_guarded[slot].end.store(0);
  g_guarded[slot].begin.store(0);
  g_guarded[slot].lost.store(nullptr, std::memory_order_release);
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (it is refused below).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file ({}); a model must be a GGUF file on disk", path, file_kind(st.st_mode));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes: {}", path, size_, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
    guard_slot_ = guard(data_, size_, &lost_pages_);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  unguard(guard_slot_);
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::check_intact() const {
  if (lost_pages())
    fail("{}: the file was truncated (or replaced) while in use: reads past its new end returned zeros; "
         "restore the file and restart", path_);
}

}  // namespace rl
