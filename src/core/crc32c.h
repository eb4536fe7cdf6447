/* CRC32C (Castagnoli), the checksum of every dlrec binary file section.
 * Uses the SSE4.2 crc32 instruction when the CPU has it. */
#ifndef DLREC_CRC32C_H
#define DLREC_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) with n bytes. crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t dlrec_crc32c(uint32_t crc, const void *data, size_t n);

#endif
