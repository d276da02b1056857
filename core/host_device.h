// MANTISSA_HD marks a function compiled for both host and device: nvcc sees it as an
// inlined __host__ __device__ function, a host compiler as a plain inline one.
#pragma once

#if defined(__CUDACC__)
#define MANTISSA_HD __host__ __device__ __forceinline__
#else
#define MANTISSA_HD inline
#endif
