/*
 * test_node_config - the daemon's settings (flx/node_config.h): the file format (comments, blanks,
 * CRLF, '=' inside values), every refusal with its line and key, byte suffixes, flags after the
 * file, and the printed configuration reading back to the same settings.
 */
#include <string.h>

#include "flx/log.h"
#include "flx/model_load.h"
#include "flx/node_config.h"
#include "flx_test.h"

static void refused(const char *text, flx_status_t want, const char *needle)
{
    flx_node_config_t c;
    flx_node_config_default(&c);
    flx_status_t st = flx_node_config_parse(&c, text, strlen(text), "t.conf");
    if (st != want || !strstr(flx_error_msg(), needle)) {
        fprintf(stderr, "'%s': got %s '%s', want %s containing '%s'\n", text, flx_status_name(st), flx_error_msg(),
                flx_status_name(want), needle);
        exit(1);
    }
}

int main(void)
{
    flx_node_config_t c;
    flx_node_config_default(&c);
    CHECK(c.max_batch == 8 && c.prefill == FLX_NODE_PREFILL_UCX && !strcmp(c.grpc_listen, "127.0.0.1:50051"));
    CHECK_ST(flx_node_config_check(&c), FLX_ERR_INVALID);   /* no model */
    CHECK(strstr(flx_error_msg(), "model"));

    const char *text = "# a node\r\n"
                       "\n"
                       "   model =  /models/a b.gguf  \r\n"
                       "model-id=smol=2\n"
                       "\tgrpc-listen = [::1]:7000\n"
                       "metrics-listen = off\n"
                       "prefill = local\n"
                       "kv-capacity = 3G\n"
                       "max-message-bytes = 64K\n"
                       "numa-node = -1\n"
                       "log-format = json\n"
                       "weights = bf16\n"
                       "log-level = debug";   /* no final newline */
    CHECK_OK(flx_node_config_parse(&c, text, strlen(text), "t.conf"));
    CHECK(!strcmp(c.model, "/models/a b.gguf") && !strcmp(c.model_id, "smol=2"));
    CHECK(!strcmp(c.grpc_listen, "[::1]:7000") && !strcmp(c.metrics_listen, "off"));
    CHECK(c.prefill == FLX_NODE_PREFILL_LOCAL && c.kv_capacity_bytes == 3ull << 30 && c.max_message_bytes == 65536);
    CHECK(c.numa_node == -1 && c.log_format == FLX_LOG_JSON && c.log_level == FLX_LOG_DEBUG);
    CHECK(c.weights == FLX_WEIGHTS_BF16);
    CHECK_OK(flx_node_config_check(&c));
    /* a flag after the file wins */
    CHECK_OK(flx_node_config_set(&c, "max-batch", "16"));
    CHECK(c.max_batch == 16);

    /* the printed configuration parses back to the same settings */
    size_t need = flx_node_config_format(&c, NULL, 0);
    char *buf = malloc(need + 1);
    CHECK(flx_node_config_format(&c, buf, need + 1) == need && strlen(buf) == need);
    flx_node_config_t d;
    flx_node_config_default(&d);
    CHECK_OK(flx_node_config_parse(&d, buf, need, "printed"));
    CHECK(memcmp(&c, &d, sizeof c) == 0);
    char small[16];
    CHECK(flx_node_config_format(&c, small, sizeof small) == need && strlen(small) == sizeof small - 1);
    free(buf);

    /* refusals: line and key named; cfg untouched by a bad value */
    refused("max-batch = 0\n", FLX_ERR_INVALID, "t.conf:1: max-batch '0' is not an integer in 1..256");
    refused("\n\nbogus = 1\n", FLX_ERR_INVALID, "t.conf:3: unknown key 'bogus'");
    refused("max-batch 4\n", FLX_ERR_INVALID, "t.conf:1: expected 'key = value'");
    refused("max-batch = 4\nmax-batch = 5\n", FLX_ERR_INVALID, "t.conf:2: key 'max-batch' already set on line 1");
    refused("max-batch = 4x\n", FLX_ERR_INVALID, "max-batch '4x'");
    refused("max-batch = -4\n", FLX_ERR_INVALID, "max-batch '-4'");
    refused("max-batch = \n", FLX_ERR_INVALID, "max-batch ''");
    refused("kv-capacity = 12Q\n", FLX_ERR_INVALID, "kv-capacity '12Q'");
    refused("weights = q4\n", FLX_ERR_INVALID, "t.conf:1: weights 'q4' is not compact or bf16");
    refused("kv-capacity = 99999999999T\n", FLX_ERR_INVALID, "kv-capacity");
    refused("kv-capacity = 1K\n", FLX_ERR_INVALID, "kv-capacity '1K' is not a byte count in 1048576..");
    refused("grpc-listen = localhost\n", FLX_ERR_INVALID, "grpc-listen 'localhost' is not host:port");
    refused("grpc-listen = a b:80\n", FLX_ERR_INVALID, "grpc-listen 'a b:80'");
    refused("grpc-listen = h:70000\n", FLX_ERR_INVALID, "port '70000'");
    refused("grpc-listen = [::1:80\n", FLX_ERR_INVALID, "brackets");
    refused("prefill = rdma\n", FLX_ERR_INVALID, "prefill 'rdma' is not ucx or local");
    refused("log-level = loud\n", FLX_ERR_INVALID, "log-level 'loud'");
    refused("numa-node = -2\n", FLX_ERR_INVALID, "numa-node '-2'");
    refused("model = a\001b\n", FLX_ERR_INVALID, "control character 0x01");
    {
        char longline[5000];
        memset(longline, 'a', sizeof longline - 1);
        longline[sizeof longline - 1] = '\0';
        refused(longline, FLX_ERR_INVALID, "t.conf:1: line of 4999 bytes");
        char model[2000] = "model = ";
        memset(model + 8, 'm', 1500);
        model[1508] = '\0';
        refused(model, FLX_ERR_INVALID, "model is 1500 bytes long, at most 1023");
    }
    {
        const char nul[] = "max-batch = 4\0\n";
        flx_node_config_default(&c);
        CHECK_ST(flx_node_config_parse(&c, nul, sizeof nul - 1, "t.conf"), FLX_ERR_INVALID);
        CHECK(strstr(flx_error_msg(), "NUL byte"));
    }
    flx_node_config_default(&c);
    CHECK_ST(flx_node_config_set(&c, "max-batch", "300"), FLX_ERR_INVALID);
    CHECK(c.max_batch == 8);
    CHECK_ST(flx_node_config_set(&c, "nope", "1"), FLX_ERR_NOT_FOUND);
    CHECK_OK(flx_node_config_set(&c, "model", "m"));
    CHECK_OK(flx_node_config_set(&c, "max-sessions", "4"));
    CHECK_ST(flx_node_config_check(&c), FLX_ERR_INVALID);   /* max-batch 8 > max-sessions 4 */
    CHECK(strstr(flx_error_msg(), "max-batch 8 exceeds max-sessions 4"));
    /* the model id goes out in the protocol's strings: UTF-8 only */
    CHECK_ST(flx_node_config_set(&c, "model-id", "bad\xff"), FLX_ERR_INVALID);
    CHECK(strstr(flx_error_msg(), "model-id is not valid UTF-8") && !c.model_id[0]);
    CHECK_OK(flx_node_config_set(&c, "model-id", "Модель"));
    /* the KV receiver's settings do nothing with a local prefill: refused, not ignored */
    CHECK_OK(flx_node_config_set(&c, "max-sessions", "8"));
    CHECK_OK(flx_node_config_set(&c, "prefill", "local"));
    CHECK_OK(flx_node_config_check(&c));
    static const char *const ucx_keys[][2] = {{"ucx-listen", "127.0.0.1:7000"}, {"ucx-advertise", "h"},
                                              {"ucx-err-mode", "none"}, {"ucx-liveness-ms", "99"}};
    for (size_t i = 0; i < FLX_ARRAY_SIZE(ucx_keys); i++) {
        flx_node_config_t u = c;
        CHECK_OK(flx_node_config_set(&u, ucx_keys[i][0], ucx_keys[i][1]));
        CHECK_ST(flx_node_config_check(&u), FLX_ERR_INVALID);
        CHECK(strstr(flx_error_msg(), ucx_keys[i][0]) && strstr(flx_error_msg(), "applies only with prefill ucx"));
        CHECK_OK(flx_node_config_set(&u, "prefill", "ucx"));
        CHECK_OK(flx_node_config_check(&u));
    }
    CHECK_ST(flx_node_config_load(&c, "/nonexistent/x.conf"), FLX_ERR_NOT_FOUND);
    for (const char *const *k = flx_node_config_keys(); *k; k++) CHECK(flx_node_config_help(*k));
    fprintf(stderr, "test_node_config: ok\n");
    return 0;
}
