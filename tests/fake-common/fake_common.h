/* What the fake drivers (tests/fake-cuda, tests/fake-hsa, tests/fake-level-zero) share: the
 * log (`say`), a copy engine that gets overlapping copies wrong, as a real one may, and the
 * reading of an ELF image's sections and global variables (a cubin, an AMD code object, a
 * zebin), as a driver finds them by name. Define FAKE_LOG_VARIABLE (the environment variable
 * naming the log file) before including it. */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What environment variable `variable` ("add_k:700") sets for kernel `name`: the text after
 * "name:", or NULL when it is unset or names another kernel. */
static inline const char *kernel_setting(const char *variable, const char *name) {
  const char *e = getenv(variable);
  size_t n = strlen(name);
  if (e && !strncmp(e, name, n) && e[n] == ':')
    return e + n + 1;
  return NULL;
}

static pthread_mutex_t fake_log_lock = PTHREAD_MUTEX_INITIALIZER;

/* Appends one line (or more) to the log file FAKE_LOG_VARIABLE names, whole, from any thread;
 * nothing when the variable is not set. */
static void say(const char *fmt, ...) {
  const char *path = getenv(FAKE_LOG_VARIABLE);
  if (!path)
    return;
  pthread_mutex_lock(&fake_log_lock);
  FILE *f = fopen(path, "a");
  if (f) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
  }
  pthread_mutex_unlock(&fake_log_lock);
}

/* A DMA engine promises nothing for overlapping ranges; this one copies in the direction that
 * gets memmove's result wrong, and says so ("overlapping-copy"). */
static inline void engine_copy(unsigned char *dst, const unsigned char *src, size_t n) {
  if (dst < src + n && src < dst + n && dst != src) {
    say("overlapping-copy 0x%lx 0x%lx %zu\n", (unsigned long)(uintptr_t)dst,
        (unsigned long)(uintptr_t)src, n);
    if (dst > src)
      for (size_t i = 0; i < n; ++i)
        dst[i] = src[i];
    else
      for (size_t i = n; i-- > 0;)
        dst[i] = src[i];
    return;
  }
  memcpy(dst, src, n);
}

/* A 64-bit ELF image's section header table, bounds-checked. */
struct elf {
  const unsigned char *bytes;
  size_t len;
  uint64_t shoff;
  uint16_t shentsize, shnum, shstrndx;
};

/* One section header's fields. */
struct elf_section {
  uint32_t name, type, link;
  uint64_t addr, off, size, entsize;
};

static inline int elf_open(struct elf *e, const unsigned char *bytes, size_t len) {
  if (len < 64)
    return 0;
  e->bytes = bytes;
  e->len = len;
  memcpy(&e->shoff, bytes + 40, 8);
  memcpy(&e->shentsize, bytes + 58, 2);
  memcpy(&e->shnum, bytes + 60, 2);
  memcpy(&e->shstrndx, bytes + 62, 2);
  return e->shentsize >= 64 && e->shoff + (uint64_t)e->shnum * e->shentsize <= len;
}

/* Section `i`, if its contents lie inside the image. */
static inline int elf_section(const struct elf *e, uint16_t i, struct elf_section *s) {
  if (i >= e->shnum)
    return 0;
  const unsigned char *h = e->bytes + e->shoff + (uint64_t)i * e->shentsize;
  memcpy(&s->name, h, 4);
  memcpy(&s->type, h + 4, 4);
  memcpy(&s->addr, h + 16, 8);
  memcpy(&s->off, h + 24, 8);
  memcpy(&s->size, h + 32, 8);
  memcpy(&s->link, h + 40, 4);
  memcpy(&s->entsize, h + 56, 8);
  return s->off + s->size <= e->len;
}

/* Whether string `at` of string table `strtab` is `name`. */
static inline int elf_string_is(const struct elf *e, const struct elf_section *strtab, uint32_t at, const char *name) {
  return at < strtab->size && !strncmp((const char *)e->bytes + strtab->off + at, name, strtab->size - at);
}

/* The section called `name`. */
static inline int elf_section_by_name(const struct elf *e, const char *name, struct elf_section *out) {
  struct elf_section names;
  if (!elf_section(e, e->shstrndx, &names))
    return 0;
  for (uint16_t i = 0; i < e->shnum; ++i)
    if (elf_section(e, i, out) && elf_string_is(e, &names, out->name, name))
      return 1;
  return 0;
}

/* A defined data symbol `name` of the image's symbol tables: its bytes in the file (file
 * offset and size), or 0. */
static inline int elf_variable(const unsigned char *bytes, size_t len, const char *name, uint64_t *at, uint64_t *size) {
  struct elf e;
  if (!elf_open(&e, bytes, len))
    return 0;
  for (uint16_t i = 0; i < e.shnum; ++i) {
    struct elf_section symtab, strtab, sec;
    if (!elf_section(&e, i, &symtab) || (symtab.type != 2 && symtab.type != 11) ||
        symtab.entsize < 24 || !elf_section(&e, (uint16_t)symtab.link, &strtab))
      continue;
    for (uint64_t k = 0; k + 24 <= symtab.size; k += symtab.entsize) {
      const unsigned char *sym = bytes + symtab.off + k;
      uint32_t nm;
      uint16_t shndx;
      uint64_t value, ssize;
      memcpy(&nm, sym, 4);
      memcpy(&shndx, sym + 6, 2);
      memcpy(&value, sym + 8, 8);
      memcpy(&ssize, sym + 16, 8);
      if ((sym[4] & 0xf) != 1 /* STT_OBJECT */ || shndx == 0 || !elf_string_is(&e, &strtab, nm, name))
        continue;
      if (!elf_section(&e, shndx, &sec) || value < sec.addr || sec.off + (value - sec.addr) + ssize > len)
        return 0;
      *at = sec.off + (value - sec.addr);
      *size = ssize;
      return 1;
    }
  }
  return 0;
}

#endif
