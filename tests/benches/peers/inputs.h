/* The benchmark's inputs, the same in every runner (offload's are made by host_peers.rs with
 * the same formulas). */
#include <stdint.h>
static inline float saxpy_x(uint64_t i) { return (float)(i % 1000) * 0.5f; }
static inline float saxpy_y(uint64_t i) { return 1.0f - (float)(i % 77); }
static inline double stencil_in(uint64_t i) { return (double)(i % 100) * 0.01; }
static inline unsigned hist_in(uint64_t i) { return (unsigned)(i * 7u + (i >> 5)); }
static inline float mat_a(uint64_t i) { return (float)(i % 7) - 3.0f; }
static inline float mat_b(uint64_t i) { return (float)(i % 5) * 0.5f; }
static inline unsigned reduce_in(uint64_t i) { return (unsigned)(i % 1000); }
