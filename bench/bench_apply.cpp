// apply/<type>/<placement>/t<threads>/<shape> and apply/-/memcpy/t<threads>/<shape>:
// rope::apply_qk on a Llama-3-8B-shaped Q (32 heads) and K (8 heads) of
// head_dim 128, in place and out of place, f32 and bf16, next to a memcpy of
// the same bytes (Q and K copied to other buffers, split across the same
// number of threads). Every case counts the bytes read plus the bytes
// written, so the figures are bandwidths to read as ratios from one run.
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
            ->UseRealTime();
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
