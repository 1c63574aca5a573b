/* Internal declarations shared by the attention sources of fluxion/src. */
#ifndef FLX_ATTN_INTERNAL_H
#define FLX_ATTN_INTERNAL_H

#include "flx/attn.h"

flx_status_t flx_attn_check_view(const flx_kv_head_view_t *view, const char *who);
flx_status_t flx_attn_check_sel(const flx_kv_head_view_t *view, int level, uint32_t G, const uint32_t *sel,
                                uint32_t sel_stride, const uint32_t *k, const char *who);

/* cfg of a task of G heads (mode, blk, budgets in [0, 1]); *level_p = its pyramid level (0 for FULL). */
flx_status_t flx_attn_check_cfg(uint32_t G, const flx_attn_cfg_t *cfg, int *level_p);

/* k[h] = logical blocks head h of a checked cfg reads at level over l_cpu host tokens (FULL: all);
 * returns how many heads read some but not all of them, i.e. need scores and top-k (a head reading
 * none or all selects blocks 0..k-1 without them), and lists them, ascending, in ranked (if not
 * NULL; room for G). */
uint32_t flx_attn_cfg_blocks(uint32_t G, const flx_attn_cfg_t *cfg, int level, uint32_t l_cpu, uint32_t *k,
                             uint8_t *ranked);

/* flx_attn_score for the nh heads listed in heads (ascending, each < G): the scores of heads[i] go
 * to row i of scores (nh, n). The metadata is read once whatever nh is; a head that reads none or
 * all of the blocks needs no scores, and leaving it out saves its share of the multiply-adds. */
flx_status_t flx_attn_score_heads(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, const float *q,
                                  const uint8_t *heads, uint32_t nh, float *scores);

/* The chunk machinery of attn_cpu.c (attn.h, CHUNKS), used by the task in attn_task.c. */
/* Prepares q for attention (scaled, in the active ISA's layout) and records that ISA in ws->isa. */
void flx_attn_prep_attn_q(flx_attn_ws_t *ws, const float *q);
/* The chunk plans: set ws->win_rows / ws->host_entries (+ level, n_list); return the chunk counts. */
uint32_t flx_attn_plan_window(flx_attn_ws_t *ws, uint32_t n_win);
uint32_t flx_attn_plan_host(flx_attn_ws_t *ws, const flx_kv_head_view_t *view, int level, uint32_t n_list);
/* The online-softmax state of chunk slot c: (G, D + 16). */
float *flx_attn_slot(const flx_attn_ws_t *ws, uint32_t c);
/* One chunk into part (a slot); reads only ws's prepared q, plan, list and mask: distinct chunks may
 * run at once. */
void flx_attn_window_chunk(const flx_attn_ws_t *ws, const flx_kv_head_view_t *view, uint32_t c, float *part);
void flx_attn_host_chunk(const flx_attn_ws_t *ws, const flx_kv_head_view_t *view, uint32_t c, float *part);
/* Slots [first, first + n) merged in order -> o (G, D), lse (G). */
void flx_attn_part_finish(const flx_attn_ws_t *ws, uint32_t first, uint32_t n, float *o, float *lse);
/* Union of the heads' selections -> ws->mask, ws->list; *n_list_p = its length. */
flx_status_t flx_attn_build_union(flx_attn_ws_t *ws, uint32_t n, const uint32_t *sel, uint32_t sel_stride,
                                  const uint32_t *k, uint32_t *n_list_p);

#endif
