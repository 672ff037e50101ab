// Additions to emu_common.h for cuda_src/selective_scan.cu.
#include "emu_common.h"

