/*
 * edgevit's TCG plugin for qemu-user: exact guest instruction counts inside
 * regions that the guest marks itself, attributed to code addresses.
 *
 * Every translation block gets its own execution counter, incremented by an
 * inline add (no callback, so the emulator barely slows down). The guest
 * opens and closes a region with a marker syscall (a number no kernel
 * implements, plus a magic first argument); at each boundary the plugin
 * compares every block's counter with its value at the opening, so a region
 * holds exactly the blocks run between the two markers and how often. A
 * third marker writes the result: one line per region with its instruction
 * total, and one line per block (guest start address, instructions in the
 * block, executions summed over all regions). The host maps the addresses
 * to symbols with the guest's /proc/self/maps.
 *
 * Built against the qemu-plugin.h of the qemu source that matches the
 * emulator binary (API version 1, qemu 7.2). Arguments:
 *   out=PATH     where the dump marker writes (required)
 *   marker=N     the marker syscall number (default 0xE7E7)
 *
 * Counts are exact for one guest thread. The inline adds are not atomic:
 * with several guest threads running at once, a count can miss increments.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define MAGIC 0x65646765u /* "edge" */
#define OP_OPEN 1
#define OP_CLOSE 2
#define OP_DUMP 3
#define SLAB 8192
#define MAX_REGIONS 100000

typedef struct {
    uint64_t executions; /* the inline add's target: keep it first */
    uint64_t at_open;
    uint64_t in_regions;
    uint64_t vaddr;
    uint32_t insns;
} Block;

typedef struct Slab {
    Block blocks[SLAB];
    size_t used;
    struct Slab *next;
} Slab;

static Slab *slabs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t marker = 0xE7E7;
static char *out_path;
static int open_region;
static size_t regions;
static uint64_t region_insns[MAX_REGIONS];
static int dumped;

static Block *new_block(void)
{
    if (slabs == NULL || slabs->used == SLAB) {
        Slab *slab = calloc(1, sizeof(Slab));
        if (slab == NULL) {
            fprintf(stderr, "insn_regions: out of memory\n");
            abort();
        }
        slab->next = slabs;
        slabs = slab;
    }
    return &slabs->blocks[slabs->used++];
}

static void on_translation(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    pthread_mutex_lock(&lock);
    Block *block = new_block();
    block->vaddr = qemu_plugin_tb_vaddr(tb);
    block->insns = (uint32_t)qemu_plugin_tb_n_insns(tb);
    pthread_mutex_unlock(&lock);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &block->executions, 1);
}

static void open_marked_region(void)
{
    for (Slab *s = slabs; s; s = s->next) {
        for (size_t i = 0; i < s->used; i++) {
            s->blocks[i].at_open = s->blocks[i].executions;
        }
    }
    open_region = 1;
}

static void close_marked_region(void)
{
    uint64_t total = 0;
    for (Slab *s = slabs; s; s = s->next) {
        for (size_t i = 0; i < s->used; i++) {
            Block *b = &s->blocks[i];
            uint64_t runs = b->executions - b->at_open;
            b->in_regions += runs;
            total += runs * b->insns;
            b->at_open = b->executions;
        }
    }
    if (regions < MAX_REGIONS) {
        region_insns[regions] = total;
    }
    regions++;
    open_region = 0;
}

static void dump(void)
{
    FILE *f = fopen(out_path, "w");
    if (f == NULL) {
        fprintf(stderr, "insn_regions: cannot write %s\n", out_path);
        return;
    }
    fprintf(f, "insn_regions 1\nregions %zu\n", regions);
    for (size_t r = 0; r < regions && r < MAX_REGIONS; r++) {
        fprintf(f, "region %zu %" PRIu64 "\n", r, region_insns[r]);
    }
    for (Slab *s = slabs; s; s = s->next) {
        for (size_t i = 0; i < s->used; i++) {
            Block *b = &s->blocks[i];
            if (b->in_regions) {
                fprintf(f, "block %" PRIx64 " %" PRIu32 " %" PRIu64 "\n", b->vaddr, b->insns, b->in_regions);
            }
        }
    }
    fprintf(f, "end\n");
    fclose(f);
    dumped = 1;
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1, uint64_t a2,
                       uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    if (num != marker || a1 != MAGIC) {
        return;
    }
    pthread_mutex_lock(&lock);
    if (a2 == OP_OPEN) {
        open_marked_region();
    } else if (a2 == OP_CLOSE && open_region) {
        close_marked_region();
    } else if (a2 == OP_DUMP) {
        dump();
    }
    pthread_mutex_unlock(&lock);
}

static void on_emulator_exit(qemu_plugin_id_t id, void *unused)
{
    /* a guest that exits without the dump marker still leaves its counts */
    pthread_mutex_lock(&lock);
    if (!dumped) {
        dump();
    }
    pthread_mutex_unlock(&lock);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            out_path = argv[i] + 4;
        } else if (strncmp(argv[i], "marker=", 7) == 0) {
            marker = strtoll(argv[i] + 7, NULL, 0);
        } else {
            fprintf(stderr, "insn_regions: unknown argument %s\n", argv[i]);
            return 1;
        }
    }
    if (out_path == NULL) {
        fprintf(stderr, "insn_regions: give out=PATH\n");
        return 1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translation);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_atexit_cb(id, on_emulator_exit, NULL);
    return 0;
}
