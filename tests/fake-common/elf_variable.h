/* For the fake drivers (tests/fake-cuda, tests/fake-hsa): a global variable of an ELF image
 * (a cubin, an AMD code object), as a driver finds one by name. */
#ifndef FAKE_ELF_VARIABLE_H
#define FAKE_ELF_VARIABLE_H

#include <stdint.h>
#include <string.h>

/* A defined data symbol `name` of the image's ELF symbol table: its bytes in the file
 * (file offset and size), or 0. */
static inline int elf_variable(const unsigned char *elf, size_t len, const char *name, uint64_t *at, uint64_t *size) {
  uint64_t shoff;
  uint16_t shentsize, shnum;
  if (len < 64)
    return 0;
  memcpy(&shoff, elf + 40, 8);
  memcpy(&shentsize, elf + 58, 2);
  memcpy(&shnum, elf + 60, 2);
  if (shentsize < 64 || shoff + (uint64_t)shnum * shentsize > len)
    return 0;
  for (uint16_t i = 0; i < shnum; ++i) {
    const unsigned char *h = elf + shoff + (uint64_t)i * shentsize;
    uint32_t type, link;
    uint64_t off, sz, entsize;
    memcpy(&type, h + 4, 4);
    memcpy(&off, h + 24, 8);
    memcpy(&sz, h + 32, 8);
    memcpy(&link, h + 40, 4);
    memcpy(&entsize, h + 56, 8);
    if ((type != 2 && type != 11) || entsize < 24 || off + sz > len || link >= shnum)
      continue;
    const unsigned char *strh = elf + shoff + (uint64_t)link * shentsize;
    uint64_t stroff, strsz;
    memcpy(&stroff, strh + 24, 8);
    memcpy(&strsz, strh + 32, 8);
    if (stroff + strsz > len)
      continue;
    for (uint64_t e = 0; e + 24 <= sz; e += entsize) {
      const unsigned char *sym = elf + off + e;
      uint32_t nm;
      uint16_t shndx;
      uint64_t value, ssize;
      memcpy(&nm, sym, 4);
      memcpy(&shndx, sym + 6, 2);
      memcpy(&value, sym + 8, 8);
      memcpy(&ssize, sym + 16, 8);
      if ((sym[4] & 0xf) != 1 /* STT_OBJECT */ || nm >= strsz || shndx == 0 || shndx >= shnum ||
          strncmp((const char *)elf + stroff + nm, name, strsz - nm))
        continue;
      const unsigned char *sec = elf + shoff + (uint64_t)shndx * shentsize;
      uint64_t saddr, soff;
      memcpy(&saddr, sec + 16, 8);
      memcpy(&soff, sec + 24, 8);
      if (value < saddr || soff + (value - saddr) + ssize > len)
        return 0;
      *at = soff + (value - saddr);
      *size = ssize;
      return 1;
    }
  }
  return 0;
}

#endif
