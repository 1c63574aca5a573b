/*
 * test_kvstore_concurrency.c - many receiver threads write chunks of many sessions in random order
 * while reader threads acquire READY sessions and check their data, and a churn thread opens and
 * closes sessions. Runs under TSan in the test command (label concurrency). The store asks for
 * device windows: where a GPU exists, uploads run from the writer threads, churn opens and frees
 * device memory, and readers check each device window against the host copy; elsewhere the store
 * falls back to host windows and the test is the host-only one.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "flx/cuda_rt.h"
#include "kv_testutil.h"

#define N_SESS 12
#define N_WRITERS 4
#define N_READERS 2

static flx_kv_store_h store;
static kv_prompt_t prompts[N_SESS];
static flx_kv_session_id_t sids[N_SESS];
static atomic_uint next_chunk;
static atomic_int writers_done;
static atomic_int verified;

typedef struct { uint32_t s, l, h0, h1, t0, t1; } job_t;
static job_t *jobs;
static uint32_t n_jobs;

static void *writer(void *arg)
{
    (void)arg;
    for (;;) {
        uint32_t i = atomic_fetch_add(&next_chunk, 1);
        if (i >= n_jobs) break;
        job_t *j = &jobs[i];
        CHECK_OK(kv_push_chunk(store, sids[j->s], &prompts[j->s], j->l, j->h0, j->h1, j->t0, j->t1));
    }
    atomic_fetch_add(&writers_done, 1);
    return NULL;
}

/* With device windows: rows [0, n_win) on the device equal the host rows. */
static void check_device(flx_kv_session_h sess, const kv_prompt_t *pr)
{
    for (uint32_t l = 0; l < pr->n_layers; l++)
        for (uint32_t h = 0; h < pr->n_kv; h++) {
            flx_kv_head_view_t v;
            CHECK_OK(flx_kv_head_view(sess, l, h, &v));
            if (!v.win_k_dev) continue;
            size_t bytes = (size_t)v.n_win * v.head_dim * sizeof(flx_bf16_t);
            flx_bf16_t *k = malloc(bytes ? bytes : 1), *vv = malloc(bytes ? bytes : 1);
            CHECK(k && vv);
            CHECK_OK(flx_cuda_copy_dtoh(v.win_device, k, v.win_k_dev, bytes));
            CHECK_OK(flx_cuda_copy_dtoh(v.win_device, vv, v.win_v_dev, bytes));
            CHECK(memcmp(k, v.win_k, bytes) == 0 && memcmp(vv, v.win_v, bytes) == 0);
            free(k);
            free(vv);
        }
}

static void *reader(void *arg)
{
    uint8_t seen[N_SESS] = {0};
    int left = N_SESS;
    (void)arg;
    while (left > 0) {
        for (int s = 0; s < N_SESS; s++) {
            if (seen[s]) continue;
            flx_kv_session_h sess;
            flx_status_t st = flx_kv_session_acquire(store, sids[s], &sess);
            if (st == FLX_ERR_STATE) continue; /* still RECEIVING */
            CHECK_OK(st);
            flx_kv_session_info_t info;
            CHECK_OK(flx_kv_session_info(store, sids[s], &info));
            kv_check_placement(sess, &info, &prompts[s]);
            check_device(sess, &prompts[s]);
            flx_kv_session_release(sess);
            seen[s] = 1;
            left--;
            atomic_fetch_add(&verified, 1);
        }
        if (atomic_load(&writers_done) == N_WRITERS && left > 0) {
            /* Writers finished: every session must be READY now. */
            for (int s = 0; s < N_SESS; s++) {
                flx_kv_session_info_t info;
                CHECK_OK(flx_kv_session_info(store, sids[s], &info));
                CHECK(seen[s] || info.state == FLX_KV_READY);
            }
        }
    }
    return NULL;
}

static void *churn(void *arg)
{
    flx_rng_t *rng = arg;
    for (int i = 0; i < 300; i++) {
        flx_kv_session_params_t sp = {.prompt_len = 100 + (uint32_t)flx_rng_below(rng, 900), .max_new_tokens = 4, .flags = FLX_KV_SESSION_NO_STATS};
        flx_kv_session_id_t sid;
        flx_status_t st = flx_kv_session_open(store, &sp, &sid);
        if (st == FLX_ERR_CAPACITY) continue;
        CHECK_OK(st);
        CHECK_OK(flx_kv_session_close(store, sid));
    }
    return NULL;
}

int main(void)
{
    flx_rng_t rng, rng2;
    uint64_t seed = flx_test_seed("test_kvstore_concurrency");
    flx_rng_seed(&rng, seed);
    flx_rng_seed(&rng2, seed + 1);
    store = kv_make_store_flags(2, 4, 8, 64, 64, 256, 256u << 20,
                                FLX_KV_STORE_HUGEPAGES | FLX_KV_STORE_WINDOW_DEVICE);
    size_t cap = 0;
    for (int s = 0; s < N_SESS; s++) {
        uint32_t L = 300 + (uint32_t)flx_rng_below(&rng, 1500);
        kv_prompt_random(&prompts[s], 2, 4, 64, L, &rng);
        flx_kv_session_params_t sp = {.prompt_len = L, .max_new_tokens = 4, .flags = FLX_KV_SESSION_NO_STATS};
        CHECK_OK(flx_kv_session_open(store, &sp, &sids[s]));
        cap += 2 * 4 * (L / 16 + 1);
    }
    jobs = malloc(cap * sizeof *jobs);
    for (uint32_t s = 0; s < N_SESS; s++)
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t h = 0; h < 4; h += 2)
                for (uint32_t t0 = 0; t0 < prompts[s].L;) {
                    uint32_t t1 = t0 + 16 * (1 + (uint32_t)flx_rng_below(&rng, 12));
                    if (t1 > prompts[s].L) t1 = prompts[s].L;
                    jobs[n_jobs++] = (job_t){s, l, h, h + 2, t0, t1};
                    t0 = t1;
                }
    for (uint32_t i = n_jobs; i > 1; i--) {
        uint32_t j = (uint32_t)flx_rng_below(&rng, i);
        job_t t = jobs[i - 1];
        jobs[i - 1] = jobs[j];
        jobs[j] = t;
    }
    pthread_t w[N_WRITERS], r[N_READERS], c;
    for (int i = 0; i < N_WRITERS; i++) pthread_create(&w[i], NULL, writer, NULL);
    for (int i = 0; i < N_READERS; i++) pthread_create(&r[i], NULL, reader, NULL);
    pthread_create(&c, NULL, churn, &rng2);
    for (int i = 0; i < N_WRITERS; i++) pthread_join(w[i], NULL);
    for (int i = 0; i < N_READERS; i++) pthread_join(r[i], NULL);
    pthread_join(c, NULL);
    CHECK(atomic_load(&verified) == N_SESS * N_READERS);
    for (int s = 0; s < N_SESS; s++) {
        CHECK_OK(flx_kv_session_close(store, sids[s]));
        kv_prompt_free(&prompts[s]);
    }
    flx_kv_store_info_t si;
    flx_kv_store_info(store, &si);
    CHECK(si.used_bytes == 0 && si.n_sessions == 0 && si.device_used_bytes == 0);
    const int on_dev = si.window_on_device;
    flx_kv_store_destroy(store);
    free(jobs);
    printf("test_kvstore_concurrency: %u chunks from %d writers, %d sessions verified by %d readers (%s windows): "
           "ok\n",
           n_jobs, N_WRITERS, N_SESS, N_READERS, on_dev ? "device" : "host");
    return 0;
}
