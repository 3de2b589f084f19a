"""torch.compile runs a model that uses moekit.torch: each moekit module call is one graph break
(torch.compiler.disable; Dynamo cannot trace the nanobind module), the code around it compiles,
and values and gradients equal eager mode."""
import torch

import moekit.torch as mt
from moekit.torch import ops


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(16, 16)
        self.fc = mt.GroupedLinear(3, 16, 16, device="cpu")
        self.mlp = ops.Sequential(ops.GroupedLinear(3, 16, 64, bias=False, device="cpu"),
                                  ops.ScaledSwiGLU(), ops.GroupedLinear(3, 32, 16, bias=False,
                                                                        device="cpu"))

    def forward(self, x, probs):
        h = torch.relu(self.pre(x))
        h = self.fc(h, [3, 0, 5])
        return self.mlp(h, [3, 0, 5], probs, [3, 0, 5]) * 2


def test_compiled_model_matches_eager():
    model = Model()
    x = torch.randn(8, 16, requires_grad=True)
    probs = torch.rand(8, requires_grad=True)
    y = model(x, probs)
    y.sum().backward()
    ref = [y.detach().clone(), x.grad.clone(), probs.grad.clone(), model.pre.weight.grad.clone()]
    x.grad = probs.grad = None
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    yc = torch.compile(model, backend="aot_eager")(x, probs)
    yc.sum().backward()
    got = [yc.detach(), x.grad, probs.grad, model.pre.weight.grad]
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
