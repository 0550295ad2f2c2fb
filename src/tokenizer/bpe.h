// The merge machinery of byte-level BPE: a symbol table (every vocabulary token, plus any
// string a merge rule names that the vocabulary lacks) and a rank table of merge rules, with
// the merge loop that applies them to one pre-tokenized word.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rl {

class BpeModel {
 public:
  // Symbol ids [0, n_vocab) are the vocabulary's token ids, in order; ids past that are
  // "extra" symbols (merge parts or results missing from the vocabulary; none for Qwen2).
  explicit BpeModel(size_t expected_symbols = 0, size_t expected_merges = 0);

  int32_t n_symbols() const { return (int32_t)offsets_.size() - 1; }
  std::string_view symbol_text(int32_t id) const {
    return std::string_view(arena_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  // -1 when absent.
  int32_t find_symbol(std::string_view text) const { return find_symbol(text, hash_text(text)); }
  // With the hash already computed (hash_text), so that loads can prefetch ahead.
  int32_t find_symbol(std::string_view text, uint32_t hash) const;
  static uint32_t hash_text(std::string_view text);
  void prefetch_symbol(uint32_t hash) const { __builtin_prefetch(&index_[hash & index_mask_]); }
  void prefetch_merge(int32_t left, int32_t right) const {
    __builtin_prefetch(&merge_slots_[mix(pair_key(left, right)) & merge_mask_]);
  }
  // The concatenation a + b, looked up without building it; -1 when absent.
  int32_t find_concat(std::string_view a, std::string_view b) const;
  // Adds a symbol; the caller guarantees it is not present yet. Returns its id.
  int32_t add_symbol(std::string_view text) { return add_symbol(text, hash_text(text)); }
  int32_t add_symbol(std::string_view text, uint32_t hash);

  struct Merge {
    int32_t rank;    // position in tokenizer.ggml.merges (lower merges first)
    int32_t result;  // symbol of left + right
  };
  // Adds merge (left, right) -> result with `rank` unless the pair already has one (the first
  // occurrence in the merge list wins, as in llama.cpp).
  void add_merge(int32_t left, int32_t right, int32_t result, int32_t rank);
  const Merge* find_merge(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t i = mix(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
      const MergeSlot& s = merge_slots_[i];
      if (s.key == key) return &s.merge;
      if (s.key == kEmptyKey) return nullptr;
    }
  }
  size_t n_merges() const { return n_merges_; }

  // Applies the merges to `syms` (the initial one-byte symbols of a word) until no adjacent
  // pair has a rule: always the lowest-ranked pair, the leftmost one among equals. Picks the
  // quadratic loop for short words and the heap loop for long ones; both give the same result.
  void merge_word(std::vector<int32_t>& syms) const;
  void merge_word_short(std::vector<int32_t>& syms) const;  // O(n^2), fast for small n
  void merge_word_long(std::vector<int32_t>& syms) const;   // O(n log n)

  // Words up to this many symbols use the quadratic loop (it wins below ~64 in measurements
  // of the Qwen2 vocabulary; above it the heap loop keeps long runs from going quadratic).
  static constexpr size_t kShortWordMax = 64;

 private:
  static constexpr uint64_t kEmptyKey = ~0ull;
  struct MergeSlot {
    uint64_t key = kEmptyKey;
    Merge merge{};
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
  }
  void grow_symbol_index();
  void grow_merge_table();

  std::string arena_;             // all symbol texts, back to back
  std::vector<uint32_t> offsets_; // [n_symbols + 1] start of each text in arena_
  std::vector<uint32_t> hashes_;  // [n_symbols] hash of each text
  // Open addressing, size a power of two. The hash sits next to the id so that a probe
  // touches one cache line unless the hashes agree.
  struct IndexSlot {
    uint32_t hash;
    int32_t id;  // -1: empty
  };
  std::vector<IndexSlot> index_;
  size_t index_mask_ = 0;
  std::vector<MergeSlot> merge_slots_;
  size_t merge_mask_ = 0;
  size_t n_merges_ = 0;
};

}  // namespace rl
