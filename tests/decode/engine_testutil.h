/*
 * engine_testutil.h - helpers shared by the engine tests (test_engine_fluxion.c, test_engine_gpu.c).
 */
#ifndef FLX_ENGINE_TESTUTIL_H
#define FLX_ENGINE_TESTUTIL_H

#include "flx/predictor.h"
#include "flx_test.h"

/* A predictor whose every head predicts (bgt0, k) and the streaming logit stream_logit: zero
 * weights, the targets' means and the s output's bias set. */
static flx_predictor_h constant_predictor(float bgt0, float k, float stream_logit)
{
    flx_mlp_t m;
    CHECK_OK(flx_mlp_alloc(&m));
    m.target_mean[0] = bgt0;
    m.target_mean[1] = k;
    m.b4[2] = stream_logit;
    flx_predictor_h p;
    CHECK_OK(flx_predictor_create(&m, &p));
    flx_mlp_free(&m);
    return p;
}

#endif
