/* CRC-32C (Castagnoli) in C for the compiled decoder, where the CPU has the SSE4.2 crc32
 * instruction (x86-64): a record batch's CRC without a call into Python and without
 * importing the crc32c package (whose import alone cost every start ~17 ms). Elsewhere
 * crc32c_hw_available() is 0 and the decoder calls the Python checksums.crc32c as before.
 * Held equal to the crc32c package by tests/protocol/test_crc32c_compiled.py. */
#ifndef KWINSPECT_CRC32C_H
#define KWINSPECT_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KW_CRC32C_X86 1

static int crc32c_hw_available(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    }
    return known;
}

/* One dependency chain, 8 bytes a step: ~3 cycles per 8 bytes, well above memory speed
 * for the batch sizes Kafka sends. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(const unsigned char *p, size_t n)
{
    uint64_t c = 0xFFFFFFFFu;
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return (uint32_t)c ^ 0xFFFFFFFFu;
}
#else
static int crc32c_hw_available(void) { return 0; }
static uint32_t crc32c_hw(const unsigned char *p, size_t n)
{
    (void)p;
    (void)n;
    return 0; /* never called: crc32c_hw_available() is 0 */
}
#endif

#endif
