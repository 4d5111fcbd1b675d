// apply/<type>/<placement>/t<threads>/<shape> and apply/-/memcpy/t<threads>/<shape>:
// rope::apply_qk on a Llama-3-8B-shaped Q (32 heads) and K (8 heads) of
// head_dim 128, in place and out of place, f32 and bf16, next to a memcpy of
// the same bytes (Q and K copied to other buffers, split across the same
// number of threads). Every case counts the bytes read plus the bytes
// written, so the figures are bandwidths to read as ratios from one run;
// each apply case is also timed against that memcpy in the same iterations
// (counter vs_memcpy, paired.hpp), which the report reads.
// out_of_place uses Stores::automatic; out_of_place_cached and
// out_of_place_streaming force the store kind, to show what the choice is worth.
#include "apply_cases.hpp"

namespace {

template <class T>
void register_type(const char* type) {
  for (const QkShape& shape : {kPrefill, kDecode}) {
    for (std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
      const std::string suffix = "/t" + std::to_string(threads) + "/" + shape.q.name;
      benchmark::RegisterBenchmark(("apply/-/memcpy" + suffix + (sizeof(T) == 2 ? "_bf16" : "")).c_str(),
                                   memcpy_case<T>, shape, threads)
          ->UseRealTime();
      std::vector<Placement> placements = {Placement::in_place, Placement::out_of_place};
      if (shape.q.tokens > 1) {
        placements.push_back(Placement::out_of_place_cached);
        placements.push_back(Placement::out_of_place_streaming);
      }
      for (Placement p : placements) {
        benchmark::RegisterBenchmark(("apply/" + std::string(type) + "/" + name(p) + suffix).c_str(), apply_case<T>,
                                     shape, p, threads)
            ->UseManualTime();
      }
    }
  }
}

const bool kRegistered = [] {
  register_type<float>("f32");
  register_type<rope::BFloat16>("bf16");
  return true;
}();

}  // namespace

namespace rope_bench {

template <class T>
void native_apply_qk(rope::View<T> q, rope::View<T> k, T* q_out, T* k_out, const rope::Table<float>& table,
                     const std::int64_t* positions, const rope::Options& options) {
  if (q_out == nullptr) {
    rope::apply_qk(q, k, table, rope::Style::rotate_half, positions, options);
  } else {
    rope::apply_qk(q, k, rope::View<T>::token_major(q_out, q.tokens, q.heads, q.head_dim),
                   rope::View<T>::token_major(k_out, k.tokens, k.heads, k.head_dim), table, rope::Style::rotate_half,
                   positions, options);
  }
}
template void native_apply_qk<float>(rope::View<float>, rope::View<float>, float*, float*, const rope::Table<float>&,
                                     const std::int64_t*, const rope::Options&);
template void native_apply_qk<rope::BFloat16>(rope::View<rope::BFloat16>, rope::View<rope::BFloat16>, rope::BFloat16*,
                                              rope::BFloat16*, const rope::Table<float>&, const std::int64_t*,
                                              const rope::Options&);

}  // namespace rope_bench
