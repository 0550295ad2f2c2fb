// Host launchers of the CUDA kernels, one family per .cu file. All tensors are fp32 in device
// memory unless a weight type says otherwise; shapes are [rows][cols] row-major, "T" is the number
// of tokens in a batch. Every launcher enqueues on `stream` and returns at once.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "model/kv_type.h"
#include "quant/quant.h"

namespace rl::cuda {

// quant_tables.cu: the IQ codebooks, read from the CPU reference; idempotent.
void upload_quant_tables();
// True when matvec/matmul/get_rows support weights of this type.
bool weight_type_supported(GgmlType t);

// ---- matvec.cu: decode products (one token) ----------------------------------------------------
// One matrix-vector product of a job list: y[r] = W[r,:] · x for r < rows, W at `w` or, when w is
// null, at slot_ptrs[slot] + w_offset (slot_ptrs: a device array, e.g. the GPU-routed slots).
struct MatvecJob {
  const uint8_t* w = nullptr;
  const uint8_t* const* slot_ptrs = nullptr;
  size_t w_offset = 0;
  size_t row_bytes = 0;
  const float* x = nullptr;
  float* y = nullptr;
  // The input's Q8 form (quantize_q8), read instead of x by the matvec_q8 products.
  const int8_t* xq = nullptr;
  const float2* xds = nullptr;
  int slot = 0;
  int rows = 0;
  int y_stride = 0;  // matvec_q8 of several columns: between their outputs (0: rows)
};
// A SwiGLU pair: act[r] = SiLU(W_gate[r,:] · x) * (W_up[r,:] · x), the matrices at gate/up or, when
// null, at slot_ptrs[slot] + gate_offset / up_offset.
struct GateUpJob {
  const uint8_t* gate = nullptr;
  const uint8_t* up = nullptr;
  const uint8_t* const* slot_ptrs = nullptr;
  size_t gate_offset = 0, up_offset = 0;
  size_t row_bytes_gate = 0, row_bytes_up = 0;
  const float* x = nullptr;
  float* act = nullptr;
  const int8_t* xq = nullptr;  // the input's Q8 form, as in MatvecJob
  const float2* xds = nullptr;
  int slot = 0;
  int rows = 0;
};
// Jobs a launch (longer lists take several launches): its job list is a kernel parameter, and 40
// SwiGLU pairs' jobs fit the 4 KiB that every architecture takes. A short pass's routed experts
// (Products::expert_pairs: 16 tokens × 10 selections of the 80B) are one launch however many:
// matvec_q8_experts and matvec_q8_experts_gate_up derive each pair's job from the first.
constexpr int kMaxMatvecJobs = 40;

// How a decode product forms its sums: kExact in double, each output the fp32 rounding of the
// exact sum (the oracle's values); kFast in fp32 (the fast tier: per-product NMSE within 5e-4 of
// the exact sum, tests/cuda/matvec_test.cpp).
enum class Sums : uint8_t { kExact, kFast };

// All jobs share the weight type t and the width cols (a multiple of 32).
void matvec_jobs(GgmlType t, int cols, const MatvecJob* jobs, int n, cudaStream_t stream, Sums sums = Sums::kExact);
void matvec_gate_up(GgmlType t, int cols, const GateUpJob* jobs, int n, cudaStream_t stream,
                    Sums sums = Sums::kExact);
// The fast tier's products of F32 weights on token columns (matvec_columns.cu): each job's matrix
// read once for `columns` (1 to kMaxQ8Columns) columns, column c reading x + c·cols and writing
// y + c·y_stride (0: rows), with fp32 sums. Weights (w or the slot pointer, w_offset, row_bytes)
// and x 16-byte aligned, cols a multiple of 4: f32_columns_supported.
bool f32_columns_supported(const MatvecJob& j, int cols);
void matvec_f32_columns(int cols, const MatvecJob* jobs, int n, int columns, cudaStream_t stream);
// y[r] = W[r,:] · x,  W [rows][cols] of type t with rows `row_bytes` apart, x [cols], y [rows].
void matvec(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x,
            float* y, cudaStream_t stream, Sums sums = Sums::kExact);
// The same for n experts whose weights sit in cache slots: W_e = slot_ptrs[e] + w_offset
// (slot_ptrs: a device array of n pointers). x_e = x + e * x_stride (x_stride 0: one shared input),
// y_e = y + e * rows.
void matvec_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                    int rows, int cols, const float* x, size_t x_stride, float* y, int n,
                    cudaStream_t stream, Sums sums = Sums::kExact);
// Decode experts' SwiGLU input: act_e = SiLU(W_gate(e) · x) * (W_up(e) · x) for n experts whose
// slots are slot_ptrs[e] (gate at offset 0, up at up_offset); act [n][rows]. One launch when gate
// and up have one type; otherwise two products (the up results in scratch [n][rows]) and swiglu.
void matvec_experts_gate_up(GgmlType t_gate, GgmlType t_up, const uint8_t* const* slot_ptrs,
                            size_t up_offset, size_t row_bytes_gate, size_t row_bytes_up, int rows,
                            int cols, const float* x, float* act, float* scratch, int n, cudaStream_t stream,
                            Sums sums = Sums::kExact);

// ---- matvec_q8.cu: the fast tier's decode products on 8-bit activations (dp4a) --------------------
// The Q8 form of activations x [rows][cols] (cols a multiple of 32), per 32-value block b:
// d_b = max|x| / 127 (fp32, IEEE division), q_i = x_i / d_b rounded to nearest even (0 where d_b is
// 0), in q [rows][cols] (int8), and ds[b] = (d_b, d_b · Σ q_i) in ds [rows][cols / 32] (the block
// sum as the quantised values hold it, as llama.cpp's q8_1); a block holding a NaN or an infinity
// has d_b = NaN and q 0, so its products are NaN. q and ds 16- and 8-byte aligned.
void quantize_q8(const float* x, int rows, int cols, int8_t* q, float2* ds, cudaStream_t stream);
// True for the weight types with Q8 products: Q4_K, Q5_K, Q6_K, Q8_0, IQ2_XXS, IQ2_XS, IQ1_M.
bool q8_supported(GgmlType t);
// As matvec_jobs / matvec_gate_up (fast tier: fp32 sums), each job reading its input's Q8 form
// (xq, xds; x is not read): per 32-value block the int8 products summed in int32 by dp4a, then
// scaled in fp32. Q4_K and Q5_K weights 16-byte aligned (rows and slot offsets); the others
// 2-byte aligned, as row_size and cudaMalloc give.
// columns (1 to kMaxQ8Columns): token columns of every job, each matrix read once for up to 8 of
// them: column c reads the Q8 row c after the job's input (xq + c·cols, xds + c·cols / 32) and
// writes y + c·y_stride (a pair's act + c·rows). A column's sums are those of a one-column launch
// on its row, in the same order, wherever that launch takes one warp a row (every width up to
// 2048 columns); wider ones may split a row over warps there, and then differ by rounding.
constexpr int kMaxQ8Columns = 16;
// matvec_q8 on fp32 input: a MatvecJob with x set and xq null, of at most kQ8F32InputCols
// columns (a multiple of 128) and kQ8F32InputValues values in all (cols · token columns), is a
// launch whose blocks each write the input's Q8 form into shared memory (quantize_q8's arithmetic,
// the same bits) before their products: no quantize_q8 launch (the down products' 512-column
// inputs of a decode token or a short step). Every block repeats the conversion (at most 16 rounds
// of a warp's 128 values), so wide inputs (an LM head's 2048 columns over thousands of blocks)
// take quantize_q8 first. y must not overlap x (other blocks still read x while one writes y).
constexpr int kQ8F32InputCols = 512;
constexpr int kQ8F32InputValues = 2048;
inline bool q8_f32_input_fits(int cols, int columns) {
  return cols > 0 && cols % 128 == 0 && columns > 0 && cols <= kQ8F32InputCols &&
         (long)cols * columns <= kQ8F32InputValues;
}
// The fast tier's Q4_K / Q5_K / Q6_K products of 1 to kMaxQ8Columns token columns on the int8
// tensor cores (matmul_q8.cu, plan kernel mma-q8): jobs as matvec_q8_jobs' (w direct; xq/xds the Q8
// rows of the columns tokens; y + c·y_stride), the same numeric form, the fp32 additions in another
// order. Whole 256-column blocks, weights as mma_q8_weights_fit says; compute capability 8.0.
bool mma_q8_supported(GgmlType t);
// Whether a matrix of type t at w, rows row_bytes apart, of cols columns, is one mma-q8 takes:
// a type it has, whole 256-column blocks, weights aligned as its loads need (the launcher also
// wants them direct, not a slot's).
bool mma_q8_weights_fit(GgmlType t, const void* w, size_t row_bytes, int cols);
void matmul_q8_jobs(GgmlType t, int cols, const MatvecJob* jobs, int n, cudaStream_t stream, int columns);
void matvec_q8_jobs(GgmlType t, int cols, const MatvecJob* jobs, int n, cudaStream_t stream, int columns = 1);
void matvec_q8_gate_up(GgmlType t, int cols, const GateUpJob* jobs, int n, cudaStream_t stream, int columns = 1);
// As matvec_experts / matvec_experts_gate_up on Q8 inputs: expert e's input is the Q8 row
// e / experts_per_row of (xq, xds) (1: each its own row; K: a short pass's pairs, K a token),
// the one row 0 for all when experts_per_row is 0. With experts_per_row > 0, more than
// kMaxMatvecJobs experts are one launch whose blocks derive their job from the first (one lane
// group a row); each expert's products are those of a launch of it alone, bit for bit (H200,
// 2026-12-02, one call: a 16-row batched step's graph 19.96 ms against 20.88 in launches of 40,
// PERF.md).
void matvec_q8_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes, int rows,
                       int cols, const int8_t* xq, const float2* xds, int experts_per_row, float* y, int n,
                       cudaStream_t stream);
// The same on fp32 input rows x [..][cols] (q8_f32_input_fits(cols, 1)): each block quantises its
// expert's row as quantize_q8 would, so the outputs equal quantize_q8 then matvec_q8_experts.
void matvec_q8_experts_f32_input(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                                 int rows, int cols, const float* x, int experts_per_row, float* y, int n,
                                 cudaStream_t stream);
void matvec_q8_experts_gate_up(GgmlType t_gate, GgmlType t_up, const uint8_t* const* slot_ptrs, size_t up_offset,
                               size_t row_bytes_gate, size_t row_bytes_up, int rows, int cols, const int8_t* xq,
                               const float2* xds, float* act, float* scratch, int n, cudaStream_t stream,
                               int experts_per_row = 0);
// Each (token, selection) pair's expert slot: slot_ptrs[i] = residency_row[ids[i]] for i < n, or
// `fallback` where that expert is not resident (never, where a pass's plan takes this: every
// expert resident); *n_distinct = n (the pairs' expert reads, for the statistics).
void pair_slots(const int32_t* ids, int n, const uint64_t* residency_row, const uint8_t* fallback,
                const uint8_t** slot_ptrs, int32_t* n_distinct, cudaStream_t stream);

// ---- matmul.cu: prefill products (T tokens) -----------------------------------------------------
// Y[t][r] = W[r,:] · X[t,:], X [T][cols], Y [T][rows]. token_tile (16, 32 or 64) and k_splits
// (1, 2 or 4 blocks summing parts of the columns; more than 1 needs compute capability 9.0) force
// the kernel's shape (tests); 0 picks by the matrix's and the GPU's size.
void matmul(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x, int T,
            float* y, cudaStream_t stream, int token_tile = 0, int k_splits = 0);
// Grouped by expert: group g (of n) multiplies rows [row_off[g], row_off[g] + row_cnt[g]) of X by
// W_g = slot_ptrs[g] + w_offset into the same rows of Y. slot_ptrs, row_off, row_cnt live on the
// device; max_cnt bounds row_cnt (sizes the grid).
void matmul_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                    int rows, int cols, const float* x, const int* row_off, const int* row_cnt,
                    int n, int max_cnt, float* y, cudaStream_t stream);
// A SwiGLU pair in one product: act[t][r] = SiLU(gate[r,:] · X[t,:]) * (up[r,:] · X[t,:]), bit for
// bit what the two products with 16-token tiles and no column split, then swiglu, give (matmul's
// own pick may split the columns, which moves a sum's rounding, not its exactness). gate and up
// have one type and one row size; for experts they are slot_ptrs[g] + gate_offset / up_offset,
// over the groups as in matmul_experts.
void matmul_gate_up(GgmlType t, const void* gate, const void* up, size_t row_bytes, int rows, int cols,
                    const float* x, int T, float* act, cudaStream_t stream);
void matmul_experts_gate_up(GgmlType t, const uint8_t* const* slot_ptrs, size_t gate_offset, size_t up_offset,
                            size_t row_bytes, int rows, int cols, const float* x, const int* row_off,
                            const int* row_cnt, int n, int max_cnt, float* act, cudaStream_t stream);

// ---- matmul_bf16.cu: fast-tier prefill products (T tokens) on bf16 tensor cores --------------------
// As matmul / matmul_experts / matmul_gate_up / matmul_experts_gate_up (same shapes, groups and
// SwiGLU epilogue), in the fast tier's arithmetic: weights dequantised to fp32 and rounded to bf16,
// activations rounded to bf16, products summed in fp32 (normalised squared error ≈ 1e-5 against
// the exact sums; the tier's bar is 5e-4). Every type dispatch_type runs; compute capability 8.0 or
// newer. cols a multiple of 32 and of the type's block; row_bytes at least a row and whole blocks;
// x 16-byte aligned (rows of cols floats from cudaMalloc are); w, gate, up and the slot offsets
// as aligned as the type's block size allows (4, 2 or 1 bytes: every cudaMalloc'd matrix and
// 256-byte slot is). Groups: row_cnt[g] <= max_cnt (rows past max_cnt are not computed).
// token_tile (16, or 64 for matmul_bf16 and 32 for matmul_bf16_gate_up) forces the kernel's token
// tile (tests); 0 picks by the grid's size.
// matmul_bf16 with a scratch of scratch_floats floats (used by no other stream meanwhile): a
// product whose grid leaves the GPU idle is split over its columns in slices of whole 256 columns,
// each slice's partial sums in the scratch, then added in slice order (fp32, one more launch), so
// its bits depend on T (through the slices) but not on timing. `slices` 0 picks
// (matmul_bf16_slices; never without a scratch or with token_tile 16), 1 never splits, more
// forces that many at most (tests: a scratch and the 64-token tile needed).
void matmul_bf16(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x, int T,
                 float* y, cudaStream_t stream, int token_tile = 0, float* scratch = nullptr,
                 size_t scratch_floats = 0, int slices = 0);
// The slices matmul_bf16 picks for this shape on the current device: enough 64-token blocks for two
// an SM, at most one a 256 columns and what the scratch holds; 1 where the grid fills the GPU.
int matmul_bf16_slices(int rows, int cols, int T, size_t scratch_floats);
void matmul_bf16_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                         int rows, int cols, const float* x, const int* row_off, const int* row_cnt,
                         int n, int max_cnt, float* y, cudaStream_t stream);
void matmul_bf16_gate_up(GgmlType t, const void* gate, const void* up, size_t row_bytes, int rows, int cols,
                         const float* x, int T, float* act, cudaStream_t stream, int token_tile = 0);
void matmul_bf16_experts_gate_up(GgmlType t, const uint8_t* const* slot_ptrs, size_t gate_offset,
                                 size_t up_offset, size_t row_bytes, int rows, int cols, const float* x,
                                 const int* row_off, const int* row_cnt, int n, int max_cnt, float* act,
                                 cudaStream_t stream);

// ---- matmul_x24.cu: prefill products of the IQ types on 8-bit tensor cores ----------------------
// The X24 form of activations X [rows][cols] (cols a multiple of 256): per row and 256 columns a
// scale 2^(e-23) (xscale [rows][cols/256], double; NaN where the block holds a NaN or infinity) with
// 2^e above the block's largest magnitude, and each value as n = round(x / scale) clamped to
// [-2^23, 2^23 - 1], in three byte planes per 32 columns (xq [rows][cols/32][3][32]: n >> 16 signed,
// (n >> 8) & 255, n & 255). x24_bytes: the size of xq. x and xq 16-byte aligned (vector loads and
// stores), as cudaMalloc and whole rows of such widths give.
// The X8 form (the fast tier's): the same layout with one plane, n = round(x / scale) in int8 with
// scale = (the block's largest magnitude) / 127, as llama.cpp's q8_1 activations but per 256 columns.
// An XForm's value is its number of byte planes.
enum class XForm : uint8_t { kX8 = 1, kX24 = 3, kX32 = 4 };
constexpr size_t x24_bytes(size_t rows, size_t cols, XForm form = XForm::kX24) {
  return rows * cols * (size_t)form;
}
void quantize_x24(const float* x, int rows, int cols, uint8_t* xq, double* xscale, cudaStream_t stream,
                  XForm form = XForm::kX24);
// The X32 form: as X24 with the scale 2^(e-31), n = round(x / scale) clamped to 32 bits, in four
// byte planes (xq [rows][cols/32][4][32]: n >> 24 signed, then the next bytes unsigned; exact for
// every value of magnitude 2^(e-8) or more, i.e. at least 2^-7 of its block's largest), and xsum
// [rows][cols/32] (double, exact): the sum of n over each 32 columns. x32_bytes: the size of xq.
// form kX8: the X8 form with xsum (the fast tier's Q4_K products).
constexpr size_t x32_bytes(size_t rows, size_t cols, XForm form = XForm::kX32) { return rows * cols * (size_t)form; }
void quantize_x32(const float* x, int rows, int cols, uint8_t* xq, double* xscale, double* xsum, cudaStream_t stream,
                  XForm form = XForm::kX32);
// True for the weight types with X24 products (IQ2_XXS, IQ2_XS, IQ1_M).
bool x24_supported(GgmlType t);
// As matmul / matmul_experts / matmul_gate_up / matmul_experts_gate_up, on X24 (or X8: form)
// activations: every output is the fp32 rounding of the sum of exact products w · x̃ (x̃ = n · scale,
// the activations the form holds), summed in double; compute capability 8.0 or newer.
void matmul_x24(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const uint8_t* xq,
                const double* xscale, int T, float* y, cudaStream_t stream, XForm form = XForm::kX24);
void matmul_x24_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes, int rows,
                        int cols, const uint8_t* xq, const double* xscale, const int* row_off, const int* row_cnt,
                        int n, int max_cnt, float* y, cudaStream_t stream, XForm form = XForm::kX24);
void matmul_x24_gate_up(GgmlType t, const void* gate, const void* up, size_t row_bytes, int rows, int cols,
                        const uint8_t* xq, const double* xscale, int T, float* act, cudaStream_t stream,
                        XForm form = XForm::kX24);
void matmul_x24_experts_gate_up(GgmlType t, const uint8_t* const* slot_ptrs, size_t gate_offset, size_t up_offset,
                                size_t row_bytes, int rows, int cols, const uint8_t* xq, const double* xscale,
                                const int* row_off, const int* row_cnt, int n, int max_cnt, float* act,
                                cudaStream_t stream, XForm form = XForm::kX24);

// ---- matmul_x32.cu: dense prefill products of Q4_K on 8-bit tensor cores ----------------------------
// Y [T][rows] = X̂ · Wᵀ on X32 activations (quantize_x32, with xsum): every output the fp32 rounding
// of the sum of products w · x̂, w the exact Q4_K value d·sc·q − dmin·m (the oracle rounds it to fp32
// once), summed in double. Compute capability 9.0; w, row_bytes and xq 16-byte aligned, xscale and
// xsum 8-byte aligned (cp.async copies), as cudaMalloc gives. form kX8: on the X8 form (quantize_x32
// with kX8), every output the fp32 rounding of the sum of w · x̃ for those activations.
// x32_supported: the weight types it takes (Q4_K); x32_blocks: the X32 form's block count (the
// X8 form's grid takes 32 tokens a block, not 24: fewer blocks).
bool x32_supported(GgmlType t);
int x32_blocks(int rows, int T);
void matmul_x32(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const uint8_t* xq,
                const double* xscale, const double* xsum, int T, float* y, cudaStream_t stream,
                XForm form = XForm::kX32);

// out[t][:] = dequantised row ids[t] of W [n_rows][cols] (the token embedding).
void get_rows(GgmlType t, const void* w, size_t row_bytes, int cols, const int32_t* ids, int T,
              float* out, cudaStream_t stream);

// ---- norm.cu -------------------------------------------------------------------------------------
// Residual add then RMSNorm, one kernel: x += y (fp32 adds, in place), out = RMSNorm(x) * w.
// The same arithmetic as add_inplace followed by rms_norm. With q8 given (width a multiple of 32),
// also out's Q8 form, the bits quantize_q8(out, ...) gives, in the same kernel where the row's
// width is a multiple of 128, else by quantize_q8 after it.
void add_rms_norm(float* x, const float* y, const float* w, float* out, int n_rows, int width,
                  float eps, cudaStream_t stream, int8_t* q8 = nullptr, float2* q8_ds = nullptr);
// Per row of `width` values (n_rows = T * heads): out = x / sqrt(mean(x²) + eps) * w (w [width];
// nullptr: no weight). In place allowed.
void rms_norm(const float* x, const float* w, float* out, int n_rows, int width, float eps,
              cudaStream_t stream);
// DeltaNet output norm: out = RMSNorm(o) * w * SiLU(z) per row of `width`.
// With q8 given (width a multiple of 32), also out's Q8 form, as add_rms_norm's (rows of `width`
// concatenated: the layout quantize_q8 gives the [T][n_rows / T · width] output).
void gated_rms_norm(const float* o, const float* z, const float* w, float* out, int n_rows,
                    int width, float eps, cudaStream_t stream, int8_t* q8 = nullptr, float2* q8_ds = nullptr);
// In place, per head of `width` values: x / sqrt(sum(x²) + eps) * scale (only the first
// scaled_heads heads of a token when scaled_heads >= 0; the others get 1). x [T][heads][width] with
// tokens `token_stride` floats apart.
void l2_norm(float* x, int T, int heads, int width, size_t token_stride, float eps, float scale,
             cudaStream_t stream, int scaled_heads = -1);

// ---- rope.cu: NeoX rotary on the first n_rot dims of each head ----------------------------------
// x [T][n_heads][head_dim] (rows `row_stride` floats apart per token), positions [T] on the device.
// theta_scale = powf(freq_base, -2.0f / n_rot), computed by the caller as the oracle does.
void rope_neox(float* x, int T, int n_heads, int head_dim, size_t row_stride, int n_rot,
               float theta_scale, const int32_t* positions, cudaStream_t stream);

// ---- attention.cu: gated attention with GQA over a KV cache --------------------------------------
// One attention layer's KV cache in device memory (--kv-type, model/kv_type.h): K and V, each
// n_ctx rows of n_kv·hd values of `type`, position-major. A q8_0 cache holds every row's int8
// values [n_ctx][n_kv·hd], then their fp16 scales [n_ctx][n_kv·hd / 32] (kv_cache_device.cuh);
// kv_bytes(type, n_ctx·n_kv·hd) a cache.
struct KvCacheRef {
  void* k = nullptr;
  void* v = nullptr;
  KvType type = KvType::kF32;
  int n_ctx = 0;  // rows allocated (where a q8_0 cache's scales begin)
};

// split_q_gate, rms_norm of q (q_norm) and k (k_norm) per head, rope_neox of both at positions
// pos_dev[t], and store_kv at pos_dev[0] + t, in one launch with the same values: q, gate
// [T][n_head][hd] from qg [T][n_head][2][hd]; k, v [T][n_kv][hd] are read, not changed. A cache of
// another type than f32 gets the fp32 key and value rounded (quantised) once each, as store_kv.
void attention_prep(const float* qg, const float* k, const float* v, float* q, float* gate, const float* q_norm,
                    const float* k_norm, const KvCacheRef& cache, int T, int n_head, int n_kv, int hd,
                    float eps, int n_rot, float theta_scale, const int32_t* pos_dev, cudaStream_t stream);
// The f32 cache of the exact tier (and of the tests).
void attention_prep(const float* qg, const float* k, const float* v, float* q, float* gate, const float* q_norm,
                    const float* k_norm, float* k_cache, float* v_cache, int T, int n_head, int n_kv, int hd,
                    float eps, int n_rot, float theta_scale, const int32_t* pos_dev, cudaStream_t stream);
// Appends k, v [T][n_kv][hd] at positions pos0.. to the caches, each value rounded to the cache's
// type (f16, bf16: to nearest even; q8_0: per block of 32 as ggml's quantize_row_q8_0_ref).
// pos_dev (device, optional): when given, pos0 is read from pos_dev[0] at run time, so a captured
// CUDA graph replays at any position.
void store_kv(const float* k, const float* v, const KvCacheRef& cache, int T, int n_kv, int hd, int pos0,
              cudaStream_t stream, const int32_t* pos_dev = nullptr);
void store_kv(const float* k, const float* v, float* k_cache, float* v_cache, int T, int n_kv,
              int hd, int pos0, cudaStream_t stream, const int32_t* pos_dev = nullptr);
// Keys per split of the attention kernels (attention.cu). A decode step at depth n runs
// ceil(n / kSplitKeys) splits per KV head; 256 keys keep a split's scores in shared memory and give
// a 32k-token context 128 splits (256 blocks at the 80B's 2 KV heads) to fill the GPU.
constexpr int kSplitKeys = 256;

// A decode step's per-split partial results, in device memory the caller owns: for each query head
// and split, the weighted values acc [n_head][max_splits][hd] and the maximum and sum
// ml [n_head][max_splits][2], in double. max_splits = ceil(n_ctx / kSplitKeys) covers every
// position of a context of n_ctx tokens.
struct AttentionSplits {
  double* acc = nullptr;
  double* ml = nullptr;
  int max_splits = 0;
  static size_t bytes(int n_ctx, int n_head, int hd);
  // The views into `storage` (at least bytes(n_ctx, n_head, hd), 8-byte aligned).
  static AttentionSplits within(void* storage, int n_ctx, int n_head, int hd);
};

// For each query token t (position pos0 + t), attends causally over cache positions
// [0, pos0 + t]: out[t][h] = softmax(q·k * scale) · v with KV head h / (n_head / n_kv), times
// sigmoid(gate[t][h]). q, gate, out [T][n_head][hd]; hd a multiple of 4 up to 256. pos_dev: as for
// store_kv. A decode step (T = 1) needs `splits` covering its position; a chunk does not use them.
void gated_attention(const float* q, const float* gate, const float* k_cache, const float* v_cache,
                     float* out, int T, int n_head, int n_kv, int hd, int pos0, float scale,
                     cudaStream_t stream, const int32_t* pos_dev = nullptr,
                     const AttentionSplits* splits = nullptr);

// ---- attention_fast.cu: the fast tier's gated attention (fp16 tensor-core prefill, fp32 decode) -----
// At most this many key splits a decode step (flash-decoding): at depth n a step takes
// min(max_splits, ceil(n / 64)) splits of equal length, so the buffers below do not grow with the
// context and short contexts still spread over many blocks.
constexpr int kFastDecodeMaxSplits = 128;
// Partial results a head the split buffers hold: a decode step's splits, or a split chunk's
// T × n_splits (16 tokens split 64 ways, 76 tokens 13 ways).
constexpr int kFastSplitPartials = 1024;

// The fast tier's per-split partial results in device memory the caller owns, fp32:
// acc [n_head][kFastSplitPartials][hd] (weighted values), ml [n_head][kFastSplitPartials][2]
// (maximum in log2 units, sum): n_head × 1,024 × (hd + 2) floats (16.9 MB at the 80B's 16 heads of
// 256). A decode step uses max_splits = min(kFastDecodeMaxSplits, ceil(n_ctx / 64)) of a head's
// (any position can: past n_ctx the splits only get longer), a split chunk T × n_splits. n_head
// and hd record the shape they were made for.
struct AttentionSplitsF {
  float* acc = nullptr;
  float* ml = nullptr;
  int max_splits = 0;
  int n_head = 0;
  int hd = 0;
  static size_t bytes(int n_ctx, int n_head, int hd);
  // The views into `storage` (at least bytes(n_ctx, n_head, hd), 16-byte aligned).
  static AttentionSplitsF within(void* storage, int n_ctx, int n_head, int hd);
};

// gated_attention's function (same arguments and layouts) in the fast tier: a chunk (T > 1) by
// flash attention on tensor cores with fp16 q, k, v and probabilities, fp32 accumulation and
// softmax (relative RMS error ~1e-3 for scores of spread 2); a decode step (T = 1) in fp32
// (~1e-6), which needs `splits` made for at least n_head heads of hd dims (a chunk may use them,
// see fast_chunk_key_splits; they are then busy until it completes). hd a multiple of 16
// from 16 to 256; any n_head / n_kv group; positions up to the cache's length; q, gate, out and
// the caches 16-byte aligned at every head.
void gated_attention_fast(const float* q, const float* gate, const float* k_cache, const float* v_cache,
                          float* out, int T, int n_head, int n_kv, int hd, int pos0, float scale,
                          cudaStream_t stream, const int32_t* pos_dev = nullptr,
                          const AttentionSplitsF* splits = nullptr);
// A chunk (T > 1) given `splits` splits its keys over blocks when its rows alone would leave
// multiprocessors without two blocks (T·n_splits ≤ kFastSplitPartials: at the 80B's shape a
// 512-token chunk 2 ways, 16 tokens 64 ways), folding them as a decode step does; this many
// (1: not split). Without `splits` a chunk is never split.
int fast_chunk_key_splits(int T, int n_head, int n_kv, const AttentionSplitsF* splits);
// The same over a cache of any --kv-type (KvCacheRef): the same kernels reading each type through
// one element accessor (kv_cache_device.cuh), the same arithmetic after the load (a chunk's k and
// v are rounded to fp16 for the tensor cores, which leaves an f16 cache's values as they are).
// q8_0 needs hd a multiple of 32.
void gated_attention_fast(const float* q, const float* gate, const KvCacheRef& cache, float* out, int T, int n_head,
                          int n_kv, int hd, int pos0, float scale, cudaStream_t stream,
                          const int32_t* pos_dev = nullptr, const AttentionSplitsF* splits = nullptr);
// A batched decode step's attention (one token of each of B sessions) in one launch per kernel:
// row r (its q, gate, k, v and output rows r) attends over rows[r]'s cache at position
// pos_dev[r], with rows[r]'s split buffers. rows: a device array of B; every cache of one type
// (kv_type). max_splits: the largest rows[r].splits.max_splits. Each row's results, its cache
// row included, are those of the one-token calls on its session, bit for bit.
struct AttentionRow {
  KvCacheRef cache;
  AttentionSplitsF splits;
};
void attention_prep_rows(const float* qg, const float* k, const float* v, float* q, float* gate, const float* q_norm,
                         const float* k_norm, const AttentionRow* rows, KvType kv_type, int B, int n_head, int n_kv,
                         int hd, float eps, int n_rot, float theta_scale, const int32_t* pos_dev, cudaStream_t stream);
void gated_attention_fast_rows(const float* q, const float* gate, const AttentionRow* rows, KvType kv_type,
                               int max_splits, float* out, int B, int n_head, int n_kv, int hd, float scale,
                               const int32_t* pos_dev, cudaStream_t stream);

// ---- deltanet.cu: Gated DeltaNet ---------------------------------------------------------------------
// Causal depthwise conv (kernel K) + SiLU over channels [T][C] with state [K-1][C] (the previous
// inputs, oldest first); the state is advanced by T tokens. w [C][K] (tap K-1 = current token).
void conv1d_silu(const float* x, size_t x_stride, float* out, float* state, const float* w, int T,
                 int C, int K, cudaStream_t stream);
// beta = sigmoid(b), g = softplus(a + dt_bias) * ssm_a, per token and value head.
// ba [T][nk][2r] (grouped per key head: r b values then r a values), beta/g [T][nv].
void deltanet_gates(const float* ba, const float* dt_bias, const float* ssm_a, float* beta,
                    float* g, int T, int nk, int nv, cudaStream_t stream);
// deltanet_gates and conv1d_silu (same arguments); one launch for short chunks.
void deltanet_conv_gates(const float* x, size_t x_stride, float* out, float* state, const float* w, int T, int C,
                         int K, const float* ba, const float* dt_bias, const float* ssm_a, float* beta, float* g,
                         int nk, int nv, cudaStream_t stream);
// The recurrence over T tokens for nv value heads (key head j / (nv / nk)); S [nv][dv][dk].
// q, k [T][nk][dk] (normalised, q scaled), v [T][nv][dv], out [T][nv][dv]. Rows of q/k/v are
// `qkv_stride` floats apart per token. With `norm` (dk = 128), q and k are not yet normalised and
// the kernel applies l2_norm's arithmetic itself (eps; q_scale on q), bit for bit, without
// storing them: the decode step, one launch instead of two. rows_per_warp (1 or 2:
// bit-identical results) forces the kernel's shape (tests); 0 picks 2 when dv is a multiple of 16.
struct L2Norm {
  float eps, q_scale;
};
void deltanet_recurrence(const float* q, const float* k, const float* v, size_t qkv_stride,
                         const float* beta, const float* g, float* S, float* out, int T, int nk,
                         int nv, int dk, int dv, cudaStream_t stream, const L2Norm* norm = nullptr,
                         int rows_per_warp = 0);

// ---- deltanet_fast.cu: Gated DeltaNet in the fast tier (fp32 arithmetic) -----------------------------
// deltanet_conv_gates in fp32 (same arguments, layouts and state convention); one launch for
// chunks of up to 8 tokens, two for longer ones.
void deltanet_conv_gates_fast(const float* x, size_t x_stride, float* out, float* state, const float* w, int T,
                              int C, int K, const float* ba, const float* dt_bias, const float* ssm_a, float* beta,
                              float* g, int nk, int nv, cudaStream_t stream);
// deltanet_recurrence in fp32 (same arguments and layouts; `norm` fuses the L2 norm of q and k,
// in fp32, for any T). dk 64 or 128; S 16-byte aligned (cudaMalloc'd, at a multiple of 4 floats).
// Launched as a programmatic dependent on sm_90+: it reads S before waiting for the previous
// kernel in the stream, so that kernel must not write S (a copy or memset may). Each value head's
// rows are split over blocks of deltanet_fast_rows_per_block(lanes_per_row, rows_per_lane) rows,
// which must divide dv; lanes_per_row and rows_per_lane (8 or 16 with 1 or 2, or 4 with 1) force
// the kernel's shape (tests, measurements), 0 picks 8 and 1 (16 rows a block).
void deltanet_recurrence_fast(const float* q, const float* k, const float* v, size_t qkv_stride, const float* beta,
                              const float* g, float* S, float* out, int T, int nk, int nv, int dk, int dv,
                              cudaStream_t stream, const L2Norm* norm = nullptr, int lanes_per_row = 0,
                              int rows_per_lane = 0);
int deltanet_fast_rows_per_block(int lanes_per_row, int rows_per_lane);
// A batched decode step's conv + gates and recurrence in one launch each: B rows, row r one token
// of the session whose conv state (or recurrent state) is states[r] (a device array of B device
// pointers, each state 16-byte aligned); every other argument as above with T = B (row r of x,
// out, ba, beta, g, of q, k, v and of the output). Each row's results are those of the one-token
// call on its state, bit for bit.
void deltanet_conv_gates_fast_rows(const float* x, size_t x_stride, float* out, float* const* states, const float* w,
                                   int B, int C, int K, const float* ba, const float* dt_bias, const float* ssm_a,
                                   float* beta, float* g, int nk, int nv, cudaStream_t stream);
void deltanet_recurrence_fast_rows(const float* q, const float* k, const float* v, size_t qkv_stride,
                                   const float* beta, const float* g, float* const* states, float* out, int B, int nk,
                                   int nv, int dk, int dv, cudaStream_t stream, const L2Norm* norm = nullptr);

// ---- moe.cu ------------------------------------------------------------------------------------------
// probs[t][:] = softmax(logits[t][:]) over n_expert (in place allowed).
void softmax_rows(const float* logits, float* probs, int T, int n, cudaStream_t stream);
// act[i] = SiLU(gate[i]) * up[i] for i < n (gate/up/act of [rows][width] blocks).
void swiglu(const float* gate, const float* up, float* act, size_t n, cudaStream_t stream);
// x[t] += sum_j weights[t][j] * y[assign[t][j]] + sigmoid(shared_gate[t]) * shared[t], summed in
// the order of the oracle (routed experts in selection order, then the shared expert).
// y [n_assign][width], assign/weights [T][k] on the device, shared [T][width], shared_gate [T].
void moe_combine(float* x, const float* y, const int32_t* assign, const float* weights, int k,
                 const float* shared, const float* shared_gate, int T, int width,
                 cudaStream_t stream);
// GPU routing of one token (the GPU-routed decode path): the oracle's router rule (cpu/forward.cpp)
// — softmax over n_expert logits in double, top-k by fp32 probability with ties
// to the lower expert index, weights renormalised over the selection (times scale when non-zero).
// Each selected expert's slot address comes from residency_row [n_expert] (0: not resident); a
// missing expert e gets fallback + e * miss_stride and is counted in *miss_count. miss_stride 0:
// `fallback` is any readable slot, so the kernels that follow stay in bounds, and the host reads
// the count to discard the token; miss_stride = the slot size: `fallback` is the layer's experts in
// slot layout in mapped host memory (--miss-reads host), which the kernels read in place.
// ids/weights/slot_ptrs [k].
// Sums::kFast: the same rule in fp32 (one warp a token; a selection differs only between
// probabilities within fp32 rounding of each other).
// A layer's prediction staged ahead (--miss-reads host with --prefetch): experts[j] (j < n; -1:
// none) is in staging slot j at slots + j * the host copy's stride.
struct StagedPrediction {
  const int32_t* experts = nullptr;
  int n = 0;
  const uint8_t* slots = nullptr;
};
void route_topk(const float* logits, int n_expert, int k, float scale, const uint64_t* residency_row,
                const uint8_t* fallback, int32_t* ids, float* weights, const uint8_t** slot_ptrs,
                int32_t* miss_count, cudaStream_t stream, Sums sums = Sums::kExact, size_t miss_stride = 0,
                const uint8_t* staging = nullptr, const uint8_t** miss_src = nullptr,
                StagedPrediction pred = {});
// With staging (and a host copy: miss_stride the slot size), a missed selection k reads staging
// slot k instead (staging + k * miss_stride) and miss_src[k] names its host copy (nullptr for a
// hit); stage_misses then copies the missed experts there (grid (64, k), 16-byte loads over the
// link) before the expert kernels run. bytes: an expert's extent in its slot (a multiple of 16).
void stage_misses(const uint8_t* const* src, uint8_t* staging, int k, size_t bytes, size_t stride,
                  cudaStream_t stream);
// The prediction branch's staging of a layer: name_predicted_misses writes staged[j] = ids[j] (a
// predicted top-n) where that expert is not resident in residency_row, else -1 (one warp), then
// stage_predicted copies each named one from host + id * stride (bytes of it) to staging + j *
// stride (grid (64, n)). A missed selection found among them reads that slot (route_topk's pred),
// once the copies are done. Two launches, so that the routing waits for the names only.
void name_predicted_misses(const int32_t* ids, int n, const uint64_t* residency_row, int32_t* staged,
                           cudaStream_t stream);
void stage_predicted(const int32_t* staged, int n, const uint8_t* host, size_t bytes, size_t stride,
                     uint8_t* staging, cudaStream_t stream);
// The same rule for T tokens (logits [T][n_expert]; ids, weights [T][k]), without slots: the
// synchronous path's routing, whose ids the host reads to reserve the experts.
void route_tokens(const float* logits, int T, int n_expert, int k, float scale, int32_t* ids, float* weights,
                  cudaStream_t stream, Sums sums = Sums::kExact);
// Prefill routing without the host, for a cache that holds every expert: groups the n = T·k
// selections `ids` by expert as moe_layer's host path does — gather[a] the token of gathered row a,
// assign[i] the row of selection i, each expert's rows contiguous, experts ascending (the order of
// an expert's own rows is not fixed: each row's products do not depend on its neighbours) — and
// cuts each expert's rows into groups of at most kExpertGroupRows: group v's slot pointer (from the
// layer's residency row), first row and row count in slot_ptrs[v], group_off[v], group_cnt[v] for
// v < n_groups = expert_group_bound(n, n_expert); groups past the last have no rows. The expert
// products take them with max_cnt = kExpertGroupRows. *n_distinct (when given): the number of
// experts with rows. n_expert <= kMaxGroupExperts.
constexpr int kExpertGroupRows = 16;
constexpr int kMaxGroupExperts = 2048;
inline int expert_group_bound(int n, int n_expert) {
  return (n + kExpertGroupRows - 1) / kExpertGroupRows + (n < n_expert ? n : n_expert);
}
void group_by_expert(const int32_t* ids, int n, int k, int n_expert, const uint64_t* residency_row, int32_t* gather,
                     int32_t* assign, const uint8_t** slot_ptrs, int32_t* group_off, int32_t* group_cnt,
                     int n_groups, int32_t* n_distinct, cudaStream_t stream);
// Where a kernel also writes its output's Q8 form (quantize_q8's layout); q null: nowhere.
struct Q8Target {
  int8_t* q = nullptr;
  float2* ds = nullptr;
};
// moe_combine, then out = RMSNorm(x) * norm_w per token (the next layer's input norm): the same
// values as moe_combine followed by rms_norm. With q8 given (width a multiple of 32), also out's
// Q8 form, as add_rms_norm's.
void moe_combine_norm(float* x, const float* y, const int32_t* assign, const float* weights, int k,
                      const float* shared, const float* shared_gate, int T, int width, const float* norm_w, float eps,
                      float* out, cudaStream_t stream, int8_t* q8 = nullptr, float2* q8_ds = nullptr);
// dst[i][:] = src[idx[i]][:] for i < n (rows of width floats; gather_words: of width 32-bit words,
// copied as bits, e.g. rows of the X24 form).
void gather_rows(const float* src, const int32_t* idx, float* dst, int n, int width,
                 cudaStream_t stream);
void gather_words(const void* src, const int32_t* idx, void* dst, int n, int width, cudaStream_t stream);

// ---- elementwise.cu -----------------------------------------------------------------------------------
// Keeps one SM busy for `cycles` clock cycles: the profiler holds the stream with it while the
// host enqueues a whole token, so the stage times it then measures exclude launch gaps.
void gpu_spin(long long cycles, cudaStream_t stream);
// x += y (n floats).
void add_inplace(float* x, const float* y, size_t n, cudaStream_t stream);
// attn_q's output holds, per head, hd query values then hd gate values: qg [T][n_head][2][hd] →
// q, gate [T][n_head][hd].
void split_q_gate(const float* qg, float* q, float* gate, int T, int n_head, int hd,
                  cudaStream_t stream);

}  // namespace rl::cuda
