/* AVX-512 kernels (F/BW/VL/VNNI). Filled in below where they beat AVX2. */
#include "backend/cpu/quant_impl.h"

void ag_quant_kernels_avx512(ag_quant_kernels *k) { (void)k; }
