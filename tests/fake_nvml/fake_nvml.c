/* A stand-in for the NVIDIA driver's libnvidia-ml.so.1, so that the real
 * nvml-wrapper code path runs on machines without a GPU. Devices come from a
 * fixture file named by $FAKE_NVML_FIXTURE, re-read on every call, so a test
 * changes the "hardware" by rewriting the file. Lines:
 *   gpu uuid=GPU-a name=NVIDIA_GeForce_RTX_4060 total=BYTES used=BYTES reserved=BYTES
 *       bus=00000000:01:00.0 power=MILLIWATTS energy=MILLIJOULES util=PERCENT fail=0|1
 *       [retired=0|1|notsup|noperm]  retired pages pending (or pending=0|1); notsup as on
 *                                    A100/H100, which remap rows instead
 *       [remap=none|pending|failed]  row remapping (absent: NOT_SUPPORTED, as before Ampere)
 *       [ecc=N]                      volatile uncorrected ECC errors (absent: NOT_SUPPORTED)
 *       [procs=notsup|noperm|unknown] process listings fail so (notsup: as under WSL2)
 *       [xid=N,M,...]                critical XID events, each delivered once, in order,
 *                                    to an event set the device is registered with
 *       [events=notsup]              the device offers no events
 *       [mig=CURRENT,PENDING]        MIG mode, each 0 or 1 (absent: NOT_SUPPORTED, as on
 *                                    GPUs without MIG)
 *       [limits=notsup|noperm|disagree] r615's memory limits fail so on this GPU (disagree:
 *                                    GetMemoryLimits_v1 answers a soft limit 1 byte off)
 *       [cgused=BYTES]               GetMemoryLimits_v1's currentUsed for every group with
 *                                    limits: the driver's own per-cgroup count, which also
 *                                    sees memory its process list does not show
 *   proc gpu=INDEX pid=PID mem=BYTES|na kind=compute|graphics
 *   mig gpu=INDEX uuid=MIG-x name=NVIDIA_A100_MIG_1g.10gb total=BYTES used=BYTES
 *                                    a MIG instance of GPU INDEX (its parent, in MIG mode):
 *                                    nvmlDeviceGetMigDeviceHandleByIndex lists them in
 *                                    order; a lost parent loses them too
 * (one gpu line per device, in index order; '_' in name stands for a space).
 * With $FAKE_NVML_CACHE set, the file is parsed again only when it was
 * replaced (inode, size or change time moved): the bench reads 64 GPUs a
 * refresh and measures the daemon, not this parser. Tests leave it unset.
 * fail=1 makes every call about the device answer GPU_IS_LOST. The memory
 * query checks the v2 struct's version as the driver does.
 * Memory limits (nvmlDeviceSetMemoryLimits_v1 / GetMemoryLimits_v1, driver r615):
 * kept per (GPU, cgroup directory) in $FAKE_NVML_LIMITS (lines `UUID SOFT HARD DIR`),
 * re-read on every call, so a restarted daemon, a test and the worker itself all see
 * what was set, as they would on a real host. A directory that does not exist
 * answers NOT_FOUND, as the driver does for a namespace that is no cgroup; a limit
 * whose directory was removed is gone (removing the cgroup clears it). currentUsed
 * is the memory of the fixture's `proc` lines on that GPU whose process is in the
 * directory or below it (by its /proc/PID/cgroup, memory controller or unified).
 * With $FAKE_NVML_LIMITS_LOG set, each set is also appended there as it happened:
 * `set UUID SOFT HARD DIR procs=COMM,COMM` (the processes in DIR at that moment, by
 * their /proc/PID/comm: what had run in the group when its limit was set) or
 * `clear UUID DIR`.
 * Built with -DOMIT_OPTIONAL it leaves out power, energy, utilisation, MIG-mode,
 * retired-pages and memory-limit symbols, as an old driver or a consumer board might. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <pthread.h>

#define MAXG 64
#define MAXM 16
#define MAXP 64
typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
enum { OK = 0, UNINIT = 1, INVALID = 2, NOTSUP = 3, NOPERM = 4, NOT_FOUND = 6, INSUFFICIENT = 7, LOST = 15,
       VERSION_MISMATCH = 25, UNKNOWN = 999 };

typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem_v2_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;

/* *_rc: what the query answers (OK or an error); remap: 0 none, 1 pending, 2 failed. */
struct gpu { char uuid[96], name[96], bus[32]; unsigned long long total, used, reserved, energy, ecc, cgused; unsigned int power, util; int fail, pending, limits_rc, limits_disagree, cgused_set, retired_rc, remap, remap_rc, ecc_rc, procs_rc, events_rc, nxid, mig_rc; unsigned int mig, mig_pending; unsigned long long xid[8]; };
struct proc { int gpu; unsigned int pid; unsigned long long mem; int na, graphics; };
/* The fixture as last read. NVML is thread-safe and the daemon calls it from
 * several threads (a reading, limits set off the loop): each read of a
 * fixture whose text changed is parsed into a new snapshot, published whole
 * by one pointer store and never freed (fixtures change a few times a test),
 * so no call ever sees one half parsed. */
struct fixture {
  struct gpu G[MAXG + MAXM];
  /* MIG instances follow the GPUs in G (G[ng .. ng+nm)); mig_parent[k] is instance k's GPU. */
  int mig_parent[MAXM], nm;
  struct proc P[MAXP];
  int ng, np;
};
static struct fixture empty_fixture, *current = &empty_fixture;
static __thread struct fixture *building; /* the one load() is parsing, on its thread */
#define FX (building ? building : __atomic_load_n(&current, __ATOMIC_ACQUIRE))
#define G (FX->G)
#define mig_parent (FX->mig_parent)
#define nm (FX->nm)
#define P (FX->P)
#define ng (FX->ng)
#define np (FX->np)
static int inited;
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static void parse(FILE *f);

static const char *val(const char *line, const char *key) {
  static char buf[128];
  char pat[32];
  snprintf(pat, sizeof pat, " %s=", key);
  const char *p = strstr(line, pat);
  if (!p) return NULL;
  p += strlen(pat);
  size_t n = strcspn(p, " \t\n");
  if (n >= sizeof buf) n = sizeof buf - 1;
  memcpy(buf, p, n);
  buf[n] = 0;
  return buf;
}
static unsigned long long num(const char *line, const char *key) {
  const char *v = val(line, key);
  return v ? strtoull(v, NULL, 10) : 0;
}
static void load(void) {
  const char *path = getenv("FAKE_NVML_FIXTURE");
  static struct stat seen;
  static int cached;
  struct stat now;
  if (getenv("FAKE_NVML_CACHE") && path && !stat(path, &now)) {
    if (cached && now.st_ino == seen.st_ino && now.st_size == seen.st_size &&
        now.st_ctim.tv_sec == seen.st_ctim.tv_sec && now.st_ctim.tv_nsec == seen.st_ctim.tv_nsec)
      return;
    seen = now;
    cached = 1;
  }
  /* The file's text, compared with the last parsed: unchanged, nothing to do. */
  static char last[1 << 16];
  static size_t last_len = (size_t)-1;
  char *text = malloc(sizeof last);
  size_t len = 0;
  FILE *f = path ? fopen(path, "r") : NULL;
  if (f) { len = fread(text, 1, sizeof last, f); fclose(f); }
  pthread_mutex_lock(&load_lock);
  if (len != last_len || memcmp(text, last, len)) {
    memcpy(last, text, len);
    last_len = len;
    building = calloc(1, sizeof *building);
    FILE *m = fmemopen(text, len ? len : 1, "r");
    if (m && len) parse(m);
    if (m) fclose(m);
    __atomic_store_n(&current, building, __ATOMIC_RELEASE);
    building = NULL;
  }
  pthread_mutex_unlock(&load_lock);
  free(text);
}
/* One fixture text into `building` (the G, P, ... names are its fields here). */
static void parse(FILE *f) {
  static struct gpu M[MAXM];
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char l[520] = " ";
    strncat(l, line, sizeof l - 2);
    if (!strncmp(line, "gpu ", 4) && ng < MAXG) {
      struct gpu *g = &G[ng++];
      memset(g, 0, sizeof *g);
      const char *v;
      if ((v = val(l, "uuid"))) snprintf(g->uuid, sizeof g->uuid, "%s", v);
      if ((v = val(l, "name"))) snprintf(g->name, sizeof g->name, "%s", v);
      for (char *c = g->name; *c; c++) if (*c == '_') *c = ' ';
      if ((v = val(l, "bus"))) snprintf(g->bus, sizeof g->bus, "%s", v);
      g->total = num(l, "total"); g->used = num(l, "used"); g->reserved = num(l, "reserved");
      g->power = num(l, "power"); g->energy = num(l, "energy"); g->util = num(l, "util");
      g->fail = num(l, "fail"); g->pending = num(l, "pending");
      g->retired_rc = OK;
      if ((v = val(l, "retired"))) {
        if (!strcmp(v, "notsup")) g->retired_rc = NOTSUP;
        else if (!strcmp(v, "noperm")) g->retired_rc = NOPERM;
        else g->pending = atoi(v);
      }
      g->remap_rc = NOTSUP;
      if ((v = val(l, "remap"))) {
        g->remap_rc = OK;
        g->remap = !strcmp(v, "pending") ? 1 : !strcmp(v, "failed") ? 2 : 0;
      }
      g->ecc_rc = NOTSUP;
      if ((v = val(l, "ecc"))) { g->ecc_rc = OK; g->ecc = strtoull(v, NULL, 10); }
      g->events_rc = OK;
      if ((v = val(l, "events")) && !strcmp(v, "notsup")) g->events_rc = NOTSUP;
      if ((v = val(l, "xid"))) {
        char list[128]; snprintf(list, sizeof list, "%s", v);
        for (char *t = strtok(list, ","); t && g->nxid < 8; t = strtok(NULL, ",")) g->xid[g->nxid++] = strtoull(t, NULL, 10);
      }
      g->mig_rc = NOTSUP;
      if ((v = val(l, "mig"))) {
        g->mig_rc = OK;
        g->mig = atoi(v);
        const char *comma = strchr(v, ',');
        g->mig_pending = comma ? (unsigned)atoi(comma + 1) : g->mig;
      }
      g->limits_rc = OK;
      if ((v = val(l, "limits"))) {
        if (!strcmp(v, "notsup")) g->limits_rc = NOTSUP;
        else if (!strcmp(v, "noperm")) g->limits_rc = NOPERM;
        else if (!strcmp(v, "disagree")) g->limits_disagree = 1;
      }
      if ((v = val(l, "cgused"))) { g->cgused_set = 1; g->cgused = strtoull(v, NULL, 10); }
      g->procs_rc = OK;
      if ((v = val(l, "procs")))
        g->procs_rc = !strcmp(v, "notsup") ? NOTSUP : !strcmp(v, "noperm") ? NOPERM : UNKNOWN;
    } else if (!strncmp(line, "mig ", 4) && nm < MAXM) {
      struct gpu *m = &M[nm];
      memset(m, 0, sizeof *m);
      mig_parent[nm] = num(l, "gpu");
      const char *v;
      if ((v = val(l, "uuid"))) snprintf(m->uuid, sizeof m->uuid, "%s", v);
      if ((v = val(l, "name"))) snprintf(m->name, sizeof m->name, "%s", v);
      for (char *c = m->name; *c; c++) if (*c == '_') *c = ' ';
      m->total = num(l, "total"); m->used = num(l, "used");
      m->mig_rc = NOTSUP; m->limits_rc = NOTSUP; m->events_rc = NOTSUP; m->remap_rc = NOTSUP; m->ecc_rc = NOTSUP;
      nm++;
    } else if (!strncmp(line, "proc ", 5) && np < MAXP) {
      struct proc *p = &P[np++];
      p->gpu = num(l, "gpu"); p->pid = num(l, "pid"); p->mem = num(l, "mem");
      const char *m = val(l, "mem"); p->na = m && !strcmp(m, "na");
      const char *k = val(l, "kind"); p->graphics = k && !strcmp(k, "graphics");
    }
  }
  /* Instances after the GPUs; each shares its parent's bus and fate. */
  for (int k = 0; k < nm; k++) {
    G[ng + k] = M[k];
    int p = mig_parent[k];
    if (p >= 0 && p < ng) { memcpy(G[ng + k].bus, G[p].bus, sizeof G[p].bus); G[ng + k].fail = G[p].fail; }
  }
}
/* Device handles are index + 1, never NULL; a MIG instance's is ng + k + 1. */
static struct gpu *dev(nvmlDevice_t d, nvmlReturn_t *rc) {
  load();
  intptr_t i = (intptr_t)d - 1;
  if (!inited) { *rc = UNINIT; return NULL; }
  if (i < 0 || i >= ng + nm) { *rc = INVALID; return NULL; }
  if (G[i].fail) { *rc = LOST; return NULL; }
  *rc = OK;
  return &G[i];
}
#define DEV(d) nvmlReturn_t rc; struct gpu *g = dev(d, &rc); if (!g) return rc;

nvmlReturn_t nvmlInit_v2(void) { inited = 1; return OK; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; inited = 1; return OK; }
nvmlReturn_t nvmlShutdown(void) { inited = 0; return OK; }
const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
  case LOST: return "GPU is lost";
  case NOTSUP: return "Not Supported";
  case NOPERM: return "Insufficient Permissions";
  case VERSION_MISMATCH: return "Argument version mismatch";
  default: return "fake NVML error";
  }
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, "999.99-fake"); return OK; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { load(); if (!inited) return UNINIT; *c = ng; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
  load();
  if (!inited) return UNINIT;
  if (i >= (unsigned)ng) return INVALID;
  *d = (nvmlDevice_t)(intptr_t)(i + 1);
  return OK;
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
  load();
  if (!inited) return UNINIT;
  for (int i = 0; i < ng; i++)
    if (!strcmp(G[i].uuid, uuid)) { *d = (nvmlDevice_t)(intptr_t)(i + 1); return OK; }
  return NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) { DEV(d); *i = (unsigned)(g - G); return OK; }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int n) { DEV(d); snprintf(s, n, "%s", g->name); return OK; }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned int n) { DEV(d); snprintf(s, n, "%s", g->uuid); return OK; }
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, mem_v2_t *m) {
  DEV(d);
  if (m->version != (unsigned)(sizeof *m | 2 << 24)) return VERSION_MISMATCH;
  m->total = g->total; m->reserved = g->reserved; m->used = g->used;
  m->free = g->total > g->used + g->reserved ? g->total - g->used - g->reserved : 0;
  return OK;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, pci_t *p) {
  DEV(d);
  memset(p, 0, sizeof *p);
  snprintf(p->busId, sizeof p->busId, "%s", g->bus);
  snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%.15s", g->bus);
  return OK;
}
static nvmlReturn_t procs(nvmlDevice_t d, unsigned int *count, proc_t *out, int graphics) {
  DEV(d);
  if (g->procs_rc != OK) return g->procs_rc;
  unsigned int n = 0;
  for (int i = 0; i < np; i++) if (P[i].gpu == g - G && P[i].graphics == graphics) n++;
  if (!out || *count < n) { *count = n; return n ? INSUFFICIENT : OK; }
  unsigned int k = 0;
  for (int i = 0; i < np; i++) {
    if (P[i].gpu != g - G || P[i].graphics != graphics) continue;
    out[k].pid = P[i].pid;
    out[k].used = P[i].na ? 0xFFFFFFFFFFFFFFFFULL : P[i].mem; /* NVML_VALUE_NOT_AVAILABLE */
    out[k].gi = out[k].ci = 0xFFFFFFFF;
    k++;
  }
  *count = n;
  return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, proc_t *o) { return procs(d, c, o, 0); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, proc_t *o) { return procs(d, c, o, 1); }
#ifndef OMIT_OPTIONAL
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
  DEV(d);
  if (g->mig_rc != OK) return g->mig_rc;
  *count = 7;
  return OK;
}
/* The index-th instance of a GPU in MIG mode: NOT_FOUND for an empty slot. */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out) {
  DEV(d);
  if (g->mig_rc != OK) return g->mig_rc;
  unsigned int seen = 0;
  for (int k = 0; k < nm; k++)
    if (mig_parent[k] == g - G && seen++ == index) { *out = (nvmlDevice_t)(intptr_t)(ng + k + 1); return OK; }
  return NOT_FOUND;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is) { DEV(d); *is = (g - G) >= ng; return OK; }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
  DEV(d);
  if (g->mig_rc != OK) return g->mig_rc;
  *current = g->mig; *pending = g->mig_pending;
  return OK;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) { DEV(d); *mw = g->power; return OK; }
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) { DEV(d); *mj = g->energy; return OK; }
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, util_t *u) { DEV(d); u->gpu = g->util; u->memory = 0; return OK; }
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *state) {
  DEV(d);
  if (g->retired_rc != OK) return g->retired_rc;
  *state = g->pending;
  return OK;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failed) {
  DEV(d);
  if (g->remap_rc != OK) return g->remap_rc;
  *corr = g->remap ? 1 : 0; *unc = g->remap ? 1 : 0;
  *pending = g->remap == 1; *failed = g->remap == 2;
  return OK;
}
/* type 1: uncorrected; counter 0: volatile (since the driver loaded). */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n) {
  DEV(d);
  if (g->ecc_rc != OK) return g->ecc_rc;
  *n = (type == 1 && counter == 0) ? g->ecc : 0;
  return OK;
}
/* Events: one set; a device registered for critical XIDs gets each XID its
 * fixture lists delivered once, in order (delivered[] survives re-reads). */
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gi, ci; } event_t;
static int registered[MAXG], delivered[MAXG];
static int the_set;
nvmlReturn_t nvmlEventSetCreate(void **set) { if (!inited) return UNINIT; *set = &the_set; return OK; }
nvmlReturn_t nvmlEventSetFree(void *set) { (void)set; return OK; }
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, void *set) {
  DEV(d);
  (void)set;
  if (g->events_rc != OK) return g->events_rc;
  if (types & 0x8) registered[g - G] = 1;
  return OK;
}
nvmlReturn_t nvmlEventSetWait_v2(void *set, event_t *data, unsigned int timeout) {
  (void)set; (void)timeout;
  load();
  for (int i = 0; i < ng; i++) {
    if (registered[i] && delivered[i] < G[i].nxid) {
      data->device = (nvmlDevice_t)(intptr_t)(i + 1);
      data->eventType = 0x8;
      data->eventData = G[i].xid[delivered[i]++];
      data->gi = data->ci = 0;
      return OK;
    }
  }
  return 10; /* NVML_ERROR_TIMEOUT */
}
/* Memory limits (r615): the layouts of nvidia-ml-py 13.615's c_nvmlSetMemoryLimits_v1_t
 * and c_nvmlGetMemoryLimits_v1_t. */
typedef struct { const char *nameSpace; unsigned long long softLimit, hardLimit; } set_limits_t;
typedef struct { const char *nameSpace; unsigned long long softLimit, hardLimit, currentUsed; } get_limits_t;
#define NO_LIMIT 0xFFFFFFFFFFFFFFFFULL
#define MAXL 256
struct limit { char uuid[96]; unsigned long long soft, hard; char dir[512]; };
static struct limit L[MAXL];
static int nl;
static int is_dir(const char *p) { struct stat st; return !stat(p, &st) && S_ISDIR(st.st_mode); }
static void limits_load(void) {
  nl = 0;
  const char *path = getenv("FAKE_NVML_LIMITS");
  FILE *f = path ? fopen(path, "r") : NULL;
  if (!f) return;
  char line[700];
  while (nl < MAXL && fgets(line, sizeof line, f)) {
    struct limit *x = &L[nl];
    if (sscanf(line, "%95s %llu %llu %511[^\n]", x->uuid, &x->soft, &x->hard, x->dir) == 4 && is_dir(x->dir)) nl++;
  }
  fclose(f);
}
static void limits_save(void) {
  const char *path = getenv("FAKE_NVML_LIMITS");
  if (!path) return;
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  for (int i = 0; i < nl; i++) fprintf(f, "%s %llu %llu %s\n", L[i].uuid, L[i].soft, L[i].hard, L[i].dir);
  fclose(f);
  rename(tmp, path);
}
static struct limit *limit_of(const char *uuid, const char *dir) {
  for (int i = 0; i < nl; i++) if (!strcmp(L[i].uuid, uuid) && !strcmp(L[i].dir, dir)) return &L[i];
  return NULL;
}
/* Whether a process is in `dir` or below it. */
static int pid_in(unsigned int pid, const char *dir) {
  char p[64], line[600];
  snprintf(p, sizeof p, "/proc/%u/cgroup", pid);
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  int in = 0;
  while (!in && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    char full[700];
    *c2 = 0;
    if (!strcmp(c1 + 1, "memory")) snprintf(full, sizeof full, "/sys/fs/cgroup/memory%s", c2 + 1);
    else if (!c1[1]) snprintf(full, sizeof full, "/sys/fs/cgroup%s", c2 + 1);
    else continue;
    size_t n = strlen(dir);
    in = !strncmp(full, dir, n) && (full[n] == 0 || full[n] == '/');
  }
  fclose(f);
  return in;
}
static void limits_log(const char *uuid, const set_limits_t *s) {
  const char *path = getenv("FAKE_NVML_LIMITS_LOG");
  FILE *f = path ? fopen(path, "a") : NULL;
  if (!f) return;
  if (s->softLimit == 0 && s->hardLimit == NO_LIMIT) {
    fprintf(f, "clear %s %s\n", uuid, s->nameSpace);
    fclose(f);
    return;
  }
  fprintf(f, "set %s %llu %llu %s procs=", uuid, s->softLimit, s->hardLimit, s->nameSpace);
  char procs[600];
  snprintf(procs, sizeof procs, "%s/cgroup.procs", s->nameSpace);
  FILE *p = fopen(procs, "r");
  unsigned int pid;
  int first = 1;
  while (p && fscanf(p, "%u", &pid) == 1) {
    char comm[64] = "", cp[64];
    snprintf(cp, sizeof cp, "/proc/%u/comm", pid);
    FILE *c = fopen(cp, "r");
    if (c) { if (fgets(comm, sizeof comm, c)) comm[strcspn(comm, "\n")] = 0; fclose(c); }
    fprintf(f, "%s%s", first ? "" : ",", comm);
    first = 0;
  }
  if (p) fclose(p);
  fprintf(f, "\n");
  fclose(f);
}
/* NVML is thread-safe; the limits table here is one per process, loaded,
 * changed and saved by each call: a reading's get on one thread, loading
 * between another's change and its save, would undo that set. */
static pthread_mutex_t limits_lock = PTHREAD_MUTEX_INITIALIZER;
static nvmlReturn_t set_limits(nvmlDevice_t d, set_limits_t *s);
static nvmlReturn_t get_limits(nvmlDevice_t d, get_limits_t *o);
nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t d, set_limits_t *s) {
  pthread_mutex_lock(&limits_lock);
  nvmlReturn_t rc = set_limits(d, s);
  pthread_mutex_unlock(&limits_lock);
  return rc;
}
nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t d, get_limits_t *o) {
  pthread_mutex_lock(&limits_lock);
  nvmlReturn_t rc = get_limits(d, o);
  pthread_mutex_unlock(&limits_lock);
  return rc;
}
static nvmlReturn_t set_limits(nvmlDevice_t d, set_limits_t *s) {
  DEV(d);
  if (g->limits_rc != OK) return g->limits_rc;
  if (!s || !s->nameSpace) return INVALID;
  if (!is_dir(s->nameSpace)) return NOT_FOUND;
  if (s->hardLimit < s->softLimit) return INVALID;
  limits_load();
  struct limit *x = limit_of(g->uuid, s->nameSpace);
  if (s->softLimit == 0 && s->hardLimit == NO_LIMIT) {
    if (x) *x = L[--nl];
  } else {
    if (!x && nl < MAXL) { x = &L[nl++]; snprintf(x->uuid, sizeof x->uuid, "%s", g->uuid); snprintf(x->dir, sizeof x->dir, "%s", s->nameSpace); }
    if (!x) return UNKNOWN;
    x->soft = s->softLimit; x->hard = s->hardLimit;
  }
  limits_save();
  limits_log(g->uuid, s);
  return OK;
}
static nvmlReturn_t get_limits(nvmlDevice_t d, get_limits_t *o) {
  DEV(d);
  if (g->limits_rc != OK) return g->limits_rc;
  if (!o || !o->nameSpace) return INVALID;
  if (!is_dir(o->nameSpace)) return NOT_FOUND;
  limits_load();
  struct limit *x = limit_of(g->uuid, o->nameSpace);
  o->softLimit = x ? x->soft + g->limits_disagree : 0;
  o->hardLimit = x ? x->hard : NO_LIMIT;
  o->currentUsed = 0;
  for (int i = 0; i < np; i++)
    if (P[i].gpu == g - G && !P[i].na && pid_in(P[i].pid, o->nameSpace)) o->currentUsed += P[i].mem;
  if (x && g->cgused_set) o->currentUsed = g->cgused;
  return OK;
}
#endif
