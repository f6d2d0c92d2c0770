// Prepended to the functions tools/make_tq_fixtures.sh extracts from ggml-quants.c: ggml's block structs
// (ggml-common.h) and its fp16 conversions (ggml-impl.h).
#pragma once
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml-impl.h"
#ifndef MAX
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#endif
