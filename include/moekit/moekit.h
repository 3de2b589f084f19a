// moekit/moekit.h — umbrella header: everything a user of the library includes.
#pragma once

#include "moekit/core/checks.h"
#include "moekit/core/context.h"
#include "moekit/core/device.h"
#include "moekit/core/dtype.h"
#include "moekit/core/error.h"
#include "moekit/core/splits.h"
#include "moekit/core/tensor.h"
#include "moekit/ops/grouped_linear.h"
#include "moekit/primitives/grouped_gemm.h"
