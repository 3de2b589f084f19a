// Runs a tiny grouped linear forward through an installed moekit and checks one value.
#include <moekit/moekit.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace moekit;
  Context ctx = Context::cpu();
  GroupedLinear fc({.groups = 2, .in = 3, .out = 2, .dtype = DType::F32}, ctx);
  const std::vector<float> w = {1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6};  // [2, 2, 3]
  copy(ctx, Tensor::wrap(const_cast<float*>(w.data()), {2, 2, 3}, DType::F32, Device::cpu()),
       fc.weight());
  std::vector<float> x = {1, 1, 1, 2, 0, 1}, y(4, 7.0f);  // rows: group 0 gets 1, group 1 gets 1
  Tensor out = Tensor::wrap(y.data(), {2, 2}, DType::F32, ctx.device());
  Tensor r = fc.forward(Tensor::wrap(x.data(), {2, 3}, DType::F32, ctx.device()),
                        Splits::host({1, 1}), {.output = out});
  const bool ok = r.data() == y.data() && y[0] == 6 && y[1] == 15 && y[2] == -5 && y[3] == -14;
  std::printf("install check: y = [%g %g; %g %g] %s\n", y[0], y[1], y[2], y[3], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
