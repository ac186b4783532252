/*
 * simnvml: a simulated NVML library (libnvidia-ml.so.1) for tests, built against NVIDIA's own nvml.h.
 *
 * pynvml loads it exactly as it loads the driver's library (CDLL("libnvidia-ml.so.1"), found through
 * LD_LIBRARY_PATH or already loaded under that soname), so pynvml's own wrapper code runs unmodified:
 * its ctypes structs and version tags, its symbol lookups (FunctionNotFound when a symbol is absent),
 * its error mapping. Every NVML entry point here has the prototype nvml.h declares; the compiler checks.
 *
 * The GPU state is a dumb store: a Python driver (gpuhealth_agent.simnvml) replays a scenario file and
 * writes the facts here through the small simnvml_* control API (raw NVML units). Before each NVML call
 * the library calls the driver's hook, so the scenario's timeline advances lazily, exactly when the
 * agent asks, as the Python backend does. No thread of its own; a mutex guards the state because the
 * agent's event thread and its loop call in concurrently.
 *
 * Profiles: built with -DSIMNVML_OLD_DRIVER the library leaves out the functions a driver before
 * R535 lacks (nvmlDeviceGetTemperatureV, nvmlDeviceGetCurrentClocksEventReasons,
 * nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetGpuFabricInfo, nvmlDeviceGetGpuFabricInfoV): pynvml then
 * raises NVMLError_FunctionNotFound for them, as on such a node; and its field values do not know
 * NVML_FI_DEV_NVLINK_GET_STATE or NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (NOT_SUPPORTED per field).
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1 /* declare both the unversioned and the _vN names */
#include "nvml.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_GPUS 64
#define MAX_SETS 64
#define MAX_EVENTS 4096
#define MAX_FIELD_RETURNS 32

/* --- state ---------------------------------------------------------------------------------------- */

/* Facts by key, in NVML's raw units (milliwatts, bytes, bit masks, codes): the scenario's key names. */
#define KEYS(X)                                                                                      \
    X(temperatureCelsius) X(slowdownTemperatureCelsius) X(powerWatts) X(powerLimitWatts)             \
    X(smClockMHz) X(maxSmClockMHz) X(utilizationPercent) X(memoryUsedMiB) X(memoryTotalMiB)          \
    X(eccCorrectedVolatile) X(eccUncorrectedVolatile) X(eccCorrectedAggregate)                       \
    X(eccUncorrectedAggregate) X(retiredPagesDoubleBit) X(retiredPagesPending)                       \
    X(remappedRowsCorrectable) X(remappedRowsUncorrectable) X(remappedRowsPending)                   \
    X(remappedRowsFailure) X(clockEventReasons) X(recoveryAction) X(pcieGeneration)                  \
    X(pcieMaxGeneration) X(pcieWidth) X(pcieMaxWidth) X(pcieReplayCounter) X(nvlinks)                \
    X(nvlinkLinksDown) X(nvlinkCrcErrors) X(nvlinkReplayErrors) X(nvlinkRecoveryErrors)              \
    X(fabricState) X(fabricStatus) X(fabricCliqueId)
#define AS_ENUM(name) K_##name,
#define AS_NAME(name) #name,
enum key { KEYS(AS_ENUM) K_COUNT };
static const char *const key_names[] = {KEYS(AS_NAME)};

/* Per-device functions by pynvml's name (the name a scenario's `fail:` and `notSupported` target). */
#define FUNCTIONS(X)                                                                                 \
    X(nvmlDeviceGetName) X(nvmlDeviceGetUUID) X(nvmlDeviceGetSerial) X(nvmlDeviceGetPciInfo)         \
    X(nvmlDeviceGetTemperatureV) X(nvmlDeviceGetTemperature) X(nvmlDeviceGetTemperatureThreshold)    \
    X(nvmlDeviceGetPowerUsage) X(nvmlDeviceGetEnforcedPowerLimit) X(nvmlDeviceGetClockInfo)          \
    X(nvmlDeviceGetMaxClockInfo) X(nvmlDeviceGetUtilizationRates) X(nvmlDeviceGetMemoryInfo)         \
    X(nvmlDeviceGetTotalEccErrors) X(nvmlDeviceGetRetiredPages)                                      \
    X(nvmlDeviceGetRetiredPagesPendingStatus) X(nvmlDeviceGetRemappedRows)                           \
    X(nvmlDeviceGetCurrentClocksEventReasons) X(nvmlDeviceGetCurrentClocksThrottleReasons)           \
    X(nvmlDeviceGetFieldValues) X(nvmlDeviceGetPcieReplayCounter)                                    \
    X(nvmlDeviceGetCurrPcieLinkGeneration) X(nvmlDeviceGetMaxPcieLinkGeneration)                     \
    X(nvmlDeviceGetCurrPcieLinkWidth) X(nvmlDeviceGetMaxPcieLinkWidth) X(nvmlDeviceGetNvLinkState)   \
    X(nvmlDeviceGetNvLinkErrorCounter) X(nvmlDeviceGetGpuFabricInfo) X(nvmlDeviceGetGpuFabricInfoV)    \
    X(nvmlDeviceRegisterEvents)
#define AS_FN_ENUM(name) F_##name,
enum function { FUNCTIONS(AS_FN_ENUM) F_COUNT };
static const char *const function_names[] = {FUNCTIONS(AS_NAME)};

struct nvmlDevice_st {
    unsigned int index;
};

struct gpu {
    unsigned long long v[K_COUNT];
    nvmlReturn_t forced[F_COUNT]; /* NVML_SUCCESS: answer; else this call returns that code */
    struct { unsigned int field; nvmlReturn_t code; } field_returns[MAX_FIELD_RETURNS];
    int n_field_returns;
    int lost;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE];
    char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
};

struct event {
    unsigned int gpu;
    unsigned long long type, data;
    int at_start; /* happened at scenario time 0: the first event set created gets it */
};

struct nvmlEventSet_st {
    int used, freed;
    unsigned long long registered[MAX_GPUS]; /* event-type mask by GPU */
    int backlog;                             /* next log index to scan for at-start events */
    int backlog_end;                         /* the log's length when the set was created */
    int cursor;                              /* next log index not looked at */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct nvmlDevice_st devices[MAX_GPUS];
static struct gpu gpus[MAX_GPUS];
static unsigned int gpu_count, visible_count;
static char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = "570.124.06";
static int init_count;
static struct event events[MAX_EVENTS];
static int n_events;
static struct nvmlEventSet_st sets[MAX_SETS];
static int first_set_created;
static unsigned long long calls;
static double (*hook)(void);
static double next_change_ms = 10; /* the hook's last word: how soon the scenario changes next */

/* --- control API (simnvml_*: for the Python driver only) ---------------------------------------------- */

/* Forget everything and have `count` GPUs, all visible, with zero facts and no events. */
int simnvml_reset(unsigned int count) {
    if (count > MAX_GPUS) return -1;
    pthread_mutex_lock(&lock);
    memset(gpus, 0, sizeof gpus);
    for (unsigned int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
    gpu_count = visible_count = count;
    n_events = 0;
    memset(sets, 0, sizeof sets);
    first_set_created = 0;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* How many GPUs the driver enumerates (a container runtime that shows fewer). */
int simnvml_set_visible(unsigned int count) {
    if (count > gpu_count) return -1;
    pthread_mutex_lock(&lock);
    visible_count = count;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* `fn` runs before every NVML call and returns the seconds until the scenario next changes by itself
 * (a waiting nvmlEventSetWait_v2 sleeps that long at most; < 0 or NULL: poll every 10 ms). */
void simnvml_set_hook(double (*fn)(void)) {
    hook = fn;
    next_change_ms = 10;
}

unsigned long long simnvml_calls(void) { return calls; }

static int lookup(const char *const *names, int count, const char *name) {
    for (int i = 0; i < count; i++)
        if (strcmp(names[i], name) == 0) return i;
    return -1;
}

/* A fact of GPU `gpu` by key, in raw NVML units. -1: no such GPU or key. */
int simnvml_set(unsigned int gpu, const char *key, unsigned long long value) {
    int k = lookup(key_names, K_COUNT, key);
    if (gpu >= gpu_count || k < 0) return -1;
    pthread_mutex_lock(&lock);
    gpus[gpu].v[k] = value;
    pthread_mutex_unlock(&lock);
    return 0;
}

static void copy(char *to, size_t size, const char *from) {
    snprintf(to, size, "%s", from);
}

/* A text fact (name, uuid, serial, busId) of GPU `gpu`, or the driver version (gpu ignored). */
int simnvml_set_text(unsigned int gpu, const char *key, const char *value) {
    if (strcmp(key, "driverVersion") == 0) {
        copy(driver_version, sizeof driver_version, value);
        return 0;
    }
    if (gpu >= gpu_count) return -1;
    pthread_mutex_lock(&lock);
    struct gpu *g = &gpus[gpu];
    int ok = 0;
    if (strcmp(key, "name") == 0) copy(g->name, sizeof g->name, value);
    else if (strcmp(key, "uuid") == 0) copy(g->uuid, sizeof g->uuid, value);
    else if (strcmp(key, "serial") == 0) copy(g->serial, sizeof g->serial, value);
    else if (strcmp(key, "busId") == 0) copy(g->bus_id, sizeof g->bus_id, value);
    else ok = -1;
    pthread_mutex_unlock(&lock);
    return ok;
}

/* What a per-device function (pynvml's name) returns on GPU `gpu`: NVML_SUCCESS answers. */
int simnvml_set_return(unsigned int gpu, const char *function, int code) {
    int f = lookup(function_names, F_COUNT, function);
    if (gpu >= gpu_count || f < 0) return -1;
    pthread_mutex_lock(&lock);
    gpus[gpu].forced[f] = (nvmlReturn_t)code;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* What one field id answers in nvmlDeviceGetFieldValues on GPU `gpu` (NVML_SUCCESS: its value). */
int simnvml_set_field_return(unsigned int gpu, unsigned int field, int code) {
    if (gpu >= gpu_count) return -1;
    pthread_mutex_lock(&lock);
    struct gpu *g = &gpus[gpu];
    int i = 0;
    while (i < g->n_field_returns && g->field_returns[i].field != field) i++;
    int ok = 0;
    if (i == g->n_field_returns) {
        if (i == MAX_FIELD_RETURNS) ok = -1;
        else g->n_field_returns++;
    }
    if (ok == 0) {
        g->field_returns[i].field = field;
        g->field_returns[i].code = (nvmlReturn_t)code;
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

/* GPU `gpu` fell off the bus (every call on it answers NVML_ERROR_GPU_IS_LOST), or came back. */
int simnvml_set_lost(unsigned int gpu, int lost) {
    if (gpu >= gpu_count) return -1;
    pthread_mutex_lock(&lock);
    gpus[gpu].lost = lost;
    pthread_mutex_unlock(&lock);
    return 0;
}

/* An event (nvmlEventType*) on GPU `gpu`, with its data (the XID). */
int simnvml_push_event(unsigned int gpu, unsigned long long type, unsigned long long data, int at_start) {
    if (gpu >= gpu_count) return -1;
    pthread_mutex_lock(&lock);
    int ok = -1;
    if (n_events < MAX_EVENTS) {
        events[n_events++] = (struct event){gpu, type, data, at_start};
        ok = 0;
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

/* --- helpers ------------------------------------------------------------------------------------- */

/* Every NVML entry point starts here: count, let the driver advance the scenario, then lock. */
static void enter(void) {
    if (hook != NULL) {
        double next = hook();
        next_change_ms = next < 0 ? 10 : next * 1e3;
    }
    pthread_mutex_lock(&lock);
    calls++;
}

static nvmlReturn_t leave(nvmlReturn_t code) {
    pthread_mutex_unlock(&lock);
    return code;
}

/* The GPU behind a handle for function `f`, or the code the call must return (with the lock held). */
static nvmlReturn_t device(nvmlDevice_t wrapped, enum function f, struct gpu **out) {
    struct nvmlDevice_st *handle = wrapped.handle;
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (handle < devices || handle >= devices + gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    struct gpu *g = &gpus[handle->index];
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    if (g->forced[f] != NVML_SUCCESS) return g->forced[f];
    *out = g;
    return NVML_SUCCESS;
}

#define DEVICE(handle, f)                                                                            \
    struct gpu *g = NULL;                                                                            \
    enter();                                                                                         \
    {                                                                                                \
        nvmlReturn_t code_ = device((handle), (f), &g);                                              \
        if (code_ != NVML_SUCCESS) return leave(code_);                                              \
    }

static nvmlReturn_t text(char *to, unsigned int length, const char *from) {
    if (to == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(from) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(to, from);
    return NVML_SUCCESS;
}

static nvmlReturn_t uint_answer(struct gpu *g, enum key k, unsigned int *out) {
    if (out == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *out = (unsigned int)g->v[k];
    return leave(NVML_SUCCESS);
}

/* --- system ------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    enter();
    init_count++;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    enter();
    if (init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    init_count--;
    return leave(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    enter();
    if (init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    return leave(text(version, length, driver_version));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    enter();
    char nvml_version[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    snprintf(nvml_version, sizeof nvml_version, "13.%.60s", driver_version); /* NVML's: API.driver */
    return leave(text(version, length, nvml_version));
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    enter();
    if (init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    if (deviceCount == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *deviceCount = visible_count;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device_out) {
    enter();
    if (init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    if (device_out == NULL || index >= visible_count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    device_out->handle = &devices[index];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device_out) {
    return nvmlDeviceGetHandleByIndex_v2(index, device_out);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t wrapped, unsigned int *index) {
    struct nvmlDevice_st *handle = wrapped.handle;
    enter();
    if (init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    if (handle < devices || handle >= devices + gpu_count || index == NULL)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (handle->index >= visible_count) return leave(NVML_ERROR_GPU_IS_LOST);
    *index = handle->index;
    return leave(NVML_SUCCESS);
}

/* --- identity ------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t handle, char *name, unsigned int length) {
    DEVICE(handle, F_nvmlDeviceGetName);
    return leave(text(name, length, g->name));
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t handle, char *uuid, unsigned int length) {
    DEVICE(handle, F_nvmlDeviceGetUUID);
    return leave(text(uuid, length, g->uuid));
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t handle, char *serial, unsigned int length) {
    DEVICE(handle, F_nvmlDeviceGetSerial);
    return leave(text(serial, length, g->serial));
}

static nvmlReturn_t pci_info(nvmlDevice_t handle, nvmlPciInfo_t *pci) {
    DEVICE(handle, F_nvmlDeviceGetPciInfo);
    if (pci == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof *pci);
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    sscanf(g->bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    copy(pci->busId, sizeof pci->busId, g->bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xffff, bus, dev, fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010DE; /* H100 SXM5's device id, NVIDIA's vendor id */
    pci->pciSubSystemId = 0x16C110DE;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t handle, nvmlPciInfo_t *pci) { return pci_info(handle, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t handle, nvmlPciInfo_t *pci) { return pci_info(handle, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t handle, nvmlPciInfo_t *pci) { return pci_info(handle, pci); }

/* --- thermal, power, clocks, utilisation, memory -------------------------------------------------- */

#ifndef SIMNVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t handle, nvmlTemperature_t *temperature) {
    DEVICE(handle, F_nvmlDeviceGetTemperatureV);
    if (temperature == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != nvmlTemperature_v1) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    temperature->temperature = (int)g->v[K_temperatureCelsius];
    return leave(NVML_SUCCESS);
}
#endif

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t handle, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    DEVICE(handle, F_nvmlDeviceGetTemperature);
    if (sensorType != NVML_TEMPERATURE_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return uint_answer(g, K_temperatureCelsius, temp);
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t handle, nvmlTemperatureThresholds_t thresholdType,
                                               unsigned int *temp) {
    DEVICE(handle, F_nvmlDeviceGetTemperatureThreshold);
    if (thresholdType != NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return uint_answer(g, K_slowdownTemperatureCelsius, temp);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t handle, unsigned int *power) {
    DEVICE(handle, F_nvmlDeviceGetPowerUsage);
    return uint_answer(g, K_powerWatts, power);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t handle, unsigned int *limit) {
    DEVICE(handle, F_nvmlDeviceGetEnforcedPowerLimit);
    return uint_answer(g, K_powerLimitWatts, limit);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t handle, nvmlClockType_t type, unsigned int *clock) {
    DEVICE(handle, F_nvmlDeviceGetClockInfo);
    if (type != NVML_CLOCK_SM) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return uint_answer(g, K_smClockMHz, clock);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t handle, nvmlClockType_t type, unsigned int *clock) {
    DEVICE(handle, F_nvmlDeviceGetMaxClockInfo);
    if (type != NVML_CLOCK_SM) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return uint_answer(g, K_maxSmClockMHz, clock);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t handle, nvmlUtilization_t *utilization) {
    DEVICE(handle, F_nvmlDeviceGetUtilizationRates);
    if (utilization == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    utilization->gpu = (unsigned int)g->v[K_utilizationPercent];
    utilization->memory = 0;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t handle, nvmlMemory_t *memory) {
    DEVICE(handle, F_nvmlDeviceGetMemoryInfo);
    if (memory == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total = g->v[K_memoryTotalMiB], used = g->v[K_memoryUsedMiB];
    memory->total = total;
    memory->used = used;
    memory->free = used < total ? total - used : 0;
    return leave(NVML_SUCCESS);
}

#ifndef SIMNVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t handle, nvmlMemory_v2_t *memory) {
    DEVICE(handle, F_nvmlDeviceGetMemoryInfo);
    if (memory == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total = g->v[K_memoryTotalMiB], used = g->v[K_memoryUsedMiB];
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = used < total ? total - used : 0;
    return leave(NVML_SUCCESS);
}
#endif

static nvmlReturn_t reasons(struct gpu *g, unsigned long long *out) {
    if (out == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *out = g->v[K_clockEventReasons];
    return leave(NVML_SUCCESS);
}

#ifndef SIMNVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t handle, unsigned long long *clocksEventReasons) {
    DEVICE(handle, F_nvmlDeviceGetCurrentClocksEventReasons);
    return reasons(g, clocksEventReasons);
}
#endif

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t handle, unsigned long long *clocksThrottleReasons) {
    DEVICE(handle, F_nvmlDeviceGetCurrentClocksThrottleReasons);
    return reasons(g, clocksThrottleReasons);
}

/* --- memory errors --------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t handle, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    DEVICE(handle, F_nvmlDeviceGetTotalEccErrors);
    if (eccCounts == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    static const enum key keys[2][2] = {
        [NVML_MEMORY_ERROR_TYPE_CORRECTED] = {[NVML_VOLATILE_ECC] = K_eccCorrectedVolatile,
                                              [NVML_AGGREGATE_ECC] = K_eccCorrectedAggregate},
        [NVML_MEMORY_ERROR_TYPE_UNCORRECTED] = {[NVML_VOLATILE_ECC] = K_eccUncorrectedVolatile,
                                                [NVML_AGGREGATE_ECC] = K_eccUncorrectedAggregate},
    };
    if ((unsigned)errorType > 1 || (unsigned)counterType > 1) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *eccCounts = g->v[keys[errorType][counterType]];
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t handle, nvmlPageRetirementCause_t cause,
                                       unsigned int *pageCount, unsigned long long *addresses) {
    DEVICE(handle, F_nvmlDeviceGetRetiredPages);
    if (pageCount == NULL || (unsigned)cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    /* Only double-bit retirements are simulated; single-bit ones are none. */
    unsigned int have = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
                            ? (unsigned int)g->v[K_retiredPagesDoubleBit] : 0;
    if (*pageCount < have || (addresses == NULL && have > 0)) {
        *pageCount = have;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < have; i++) addresses[i] = 0x1000ULL * (i + 1);
    *pageCount = have;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t handle, nvmlEnableState_t *isPending) {
    DEVICE(handle, F_nvmlDeviceGetRetiredPagesPendingStatus);
    if (isPending == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *isPending = g->v[K_retiredPagesPending] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t handle, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    DEVICE(handle, F_nvmlDeviceGetRemappedRows);
    if (!corrRows || !uncRows || !isPending || !failureOccurred) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *corrRows = (unsigned int)g->v[K_remappedRowsCorrectable];
    *uncRows = (unsigned int)g->v[K_remappedRowsUncorrectable];
    *isPending = (unsigned int)g->v[K_remappedRowsPending];
    *failureOccurred = (unsigned int)g->v[K_remappedRowsFailure];
    return leave(NVML_SUCCESS);
}

/* --- PCIe ------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t handle, unsigned int *value) {
    DEVICE(handle, F_nvmlDeviceGetPcieReplayCounter);
    return uint_answer(g, K_pcieReplayCounter, value);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t handle, unsigned int *currLinkGen) {
    DEVICE(handle, F_nvmlDeviceGetCurrPcieLinkGeneration);
    return uint_answer(g, K_pcieGeneration, currLinkGen);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t handle, unsigned int *maxLinkGen) {
    DEVICE(handle, F_nvmlDeviceGetMaxPcieLinkGeneration);
    return uint_answer(g, K_pcieMaxGeneration, maxLinkGen);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t handle, unsigned int *currLinkWidth) {
    DEVICE(handle, F_nvmlDeviceGetCurrPcieLinkWidth);
    return uint_answer(g, K_pcieWidth, currLinkWidth);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t handle, unsigned int *maxLinkWidth) {
    DEVICE(handle, F_nvmlDeviceGetMaxPcieLinkWidth);
    return uint_answer(g, K_pcieMaxWidth, maxLinkWidth);
}

/* --- NVLink ---------------------------------------------------------------------------------------- */

/* Links up are the first (nvlinks - nvlinkLinksDown); a GPU's error counts sit on link 0 when it is up. */
static nvmlReturn_t link_up(struct gpu *g, unsigned int link, int *up) {
    unsigned long long links = g->v[K_nvlinks], down = g->v[K_nvlinkLinksDown];
    if (links == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= links) return NVML_ERROR_INVALID_ARGUMENT;
    *up = link < links - (down < links ? down : links);
    return NVML_SUCCESS;
}

static unsigned long long link_counter(struct gpu *g, unsigned int link, int up, enum key k) {
    return up && link == 0 ? g->v[k] : 0;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t handle, unsigned int link, nvmlEnableState_t *isActive) {
    DEVICE(handle, F_nvmlDeviceGetNvLinkState);
    int up = 0;
    nvmlReturn_t code = link_up(g, link, &up);
    if (code != NVML_SUCCESS) return leave(code);
    if (isActive == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *isActive = up ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t handle, unsigned int link, nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *counterValue) {
    DEVICE(handle, F_nvmlDeviceGetNvLinkErrorCounter);
    int up = 0;
    nvmlReturn_t code = link_up(g, link, &up);
    if (code != NVML_SUCCESS) return leave(code);
    if (counterValue == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    switch (counter) {
    case NVML_NVLINK_ERROR_DL_CRC_FLIT: *counterValue = link_counter(g, link, up, K_nvlinkCrcErrors); break;
    case NVML_NVLINK_ERROR_DL_REPLAY: *counterValue = link_counter(g, link, up, K_nvlinkReplayErrors); break;
    case NVML_NVLINK_ERROR_DL_RECOVERY: *counterValue = link_counter(g, link, up, K_nvlinkRecoveryErrors); break;
    default: *counterValue = 0; /* counters not simulated (CRC data, ECC) */
    }
    return leave(NVML_SUCCESS);
}

/* --- field values ------------------------------------------------------------------------------------ */

static void field_value(struct gpu *g, nvmlFieldValue_t *value) {
    value->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    value->value.ullVal = 0;
    value->timestamp = (long long)time(NULL) * 1000000LL;
    value->latencyUsec = 0;
    for (int i = 0; i < g->n_field_returns; i++) {
        if (g->field_returns[i].field == value->fieldId && g->field_returns[i].code != NVML_SUCCESS) {
            value->nvmlReturn = g->field_returns[i].code;
            return;
        }
    }
    int up = 0;
    value->nvmlReturn = NVML_SUCCESS;
#ifdef SIMNVML_OLD_DRIVER
    /* Field ids newer than the driver: the NVLink state field and the recovery action. */
    if (value->fieldId == NVML_FI_DEV_NVLINK_GET_STATE || value->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
        value->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        return;
    }
#endif
    switch (value->fieldId) {
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
        value->value.ullVal = g->v[K_recoveryAction];
        return;
    case NVML_FI_DEV_NVLINK_GET_STATE:
        value->nvmlReturn = link_up(g, value->scopeId, &up);
        value->value.ullVal = up ? NVML_NVLINK_STATE_ACTIVE : NVML_NVLINK_STATE_INACTIVE;
        return;
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC:
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY:
        value->nvmlReturn = link_up(g, value->scopeId, &up);
        value->value.ullVal = link_counter(
            g, value->scopeId, up,
            value->fieldId == NVML_FI_DEV_NVLINK_ERROR_DL_CRC      ? K_nvlinkCrcErrors
            : value->fieldId == NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY ? K_nvlinkReplayErrors
                                                                   : K_nvlinkRecoveryErrors);
        return;
    default:
        value->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t handle, int valuesCount, nvmlFieldValue_t *values) {
    DEVICE(handle, F_nvmlDeviceGetFieldValues);
    if (values == NULL || valuesCount < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < valuesCount; i++) field_value(g, &values[i]);
    return leave(NVML_SUCCESS);
}

/* --- fabric ---------------------------------------------------------------------------------------- */

#ifndef SIMNVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t handle, nvmlGpuFabricInfo_t *gpuFabricInfo) {
    DEVICE(handle, F_nvmlDeviceGetGpuFabricInfo);
    if (gpuFabricInfo == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g->v[K_fabricState] == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED) return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(gpuFabricInfo->clusterUuid, 0, sizeof gpuFabricInfo->clusterUuid);
    gpuFabricInfo->state = (nvmlGpuFabricState_t)g->v[K_fabricState];
    gpuFabricInfo->status = (nvmlReturn_t)g->v[K_fabricStatus];
    gpuFabricInfo->cliqueId = (unsigned int)g->v[K_fabricCliqueId];
    return leave(NVML_SUCCESS);
}

/* The versioned call: v2 and v3 share their first fields; v3 adds the health summary. */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t handle, nvmlGpuFabricInfoV_t *gpuFabricInfo) {
    DEVICE(handle, F_nvmlDeviceGetGpuFabricInfoV);
    if (gpuFabricInfo == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (g->v[K_fabricState] == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED) return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(gpuFabricInfo->clusterUuid, 0, sizeof gpuFabricInfo->clusterUuid);
    gpuFabricInfo->state = (nvmlGpuFabricState_t)g->v[K_fabricState];
    gpuFabricInfo->status = (nvmlReturn_t)g->v[K_fabricStatus];
    gpuFabricInfo->cliqueId = (unsigned int)g->v[K_fabricCliqueId];
    gpuFabricInfo->healthMask = 0;
    if (version == nvmlGpuFabricInfo_v3) gpuFabricInfo->healthSummary = NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY;
    return leave(NVML_SUCCESS);
}
#endif

/* --- events ---------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    enter();
    if (init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    if (set == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < MAX_SETS; i++) {
        if (sets[i].used && !sets[i].freed) continue; /* a freed set's slot is taken again */
        memset(&sets[i], 0, sizeof sets[i]);
        sets[i].used = 1;
        /* Like the driver, a set sees only events after it exists; the one exception (as in the Python
         * backend): events at scenario time 0 go to the first set, or a scenario's XID at 0s is unseen. */
        sets[i].backlog = first_set_created ? n_events : 0;
        sets[i].backlog_end = sets[i].cursor = n_events;
        first_set_created = 1;
        set->handle = &sets[i];
        return leave(NVML_SUCCESS);
    }
    return leave(NVML_ERROR_MEMORY);
}

static int valid_set(struct nvmlEventSet_st *set) { return set >= sets && set < sets + MAX_SETS && set->used; }

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t handle, unsigned long long eventTypes, nvmlEventSet_t wrapped) {
    struct nvmlEventSet_st *set = wrapped.handle;
    DEVICE(handle, F_nvmlDeviceRegisterEvents);
    if (!valid_set(set) || set->freed) return leave(NVML_ERROR_INVALID_ARGUMENT);
    set->registered[handle.handle->index] |= eventTypes;
    (void)g;
    return leave(NVML_SUCCESS);
}

/* The next event of the set that it registered for, or NULL (with the lock held). */
static struct event *next_event(struct nvmlEventSet_st *set) {
    while (set->backlog < set->backlog_end) {
        struct event *e = &events[set->backlog++];
        if (e->at_start && (set->registered[e->gpu] & e->type)) return e;
    }
    while (set->cursor < n_events) {
        struct event *e = &events[set->cursor++];
        if (set->registered[e->gpu] & e->type) return e;
    }
    return NULL;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t wrapped, nvmlEventData_t *data, unsigned int timeoutms) {
    struct nvmlEventSet_st *set = wrapped.handle;
    double deadline = now_ms() + timeoutms;
    for (;;) {
        enter();
        if (init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
        if (!valid_set(set) || data == NULL) return leave(NVML_ERROR_INVALID_ARGUMENT);
        if (set->freed) return leave(NVML_ERROR_UNINITIALIZED);
        struct event *e = next_event(set);
        if (e != NULL) {
            data->device.handle = &devices[e->gpu];
            data->eventType = e->type;
            data->eventData = e->data;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
            return leave(NVML_SUCCESS);
        }
        pthread_mutex_unlock(&lock);
        double left = deadline - now_ms();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        /* Sleep until the scenario's next change (the hook said when) or the timeout, then look again:
         * events come from its timeline. At least 1 ms, so a clock at the edge does not spin. */
        double step = next_change_ms < left ? next_change_ms : left;
        if (step < 1) step = 1;
        struct timespec pause = {(time_t)(step / 1e3), (long)((step - 1e3 * (time_t)(step / 1e3)) * 1e6)};
        nanosleep(&pause, NULL);
    }
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t wrapped) {
    struct nvmlEventSet_st *set = wrapped.handle;
    enter();
    if (!valid_set(set)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    set->freed = 1; /* a wait on it answers Uninitialized, as the Python backend does */
    return leave(NVML_SUCCESS);
}
