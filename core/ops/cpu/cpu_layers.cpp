#include "core/ops/cpu/cpu_backend.h"
