/*
 * fuzz_node_config - bytes as a fluxion-decoded config file, through flx_node_config_parse (what
 * --config reads after loading the file), then the cross-field check and the printer. A file that
 * parses must print to text that parses back to the same settings.
 */
#include "fuzz_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/log.h"
#include "flx/node_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    flx_log_set_level(FLX_LOG_ERROR);
    flx_node_config_t c;
    flx_node_config_default(&c);
    if (flx_node_config_parse(&c, (const char *)data, size, "fuzz") != FLX_OK) {
        FUZZ_CHECK(flx_error_msg()[0] != '\0');
        return 0;
    }
    (void)flx_node_config_check(&c);
    size_t need = flx_node_config_format(&c, NULL, 0);
    char *buf = malloc(need + 1);
    FUZZ_CHECK(buf && flx_node_config_format(&c, buf, need + 1) == need);
    flx_node_config_t d;
    flx_node_config_default(&d);
    FUZZ_CHECK(flx_node_config_parse(&d, buf, need, "printed") == FLX_OK);
    FUZZ_CHECK(memcmp(&c, &d, sizeof c) == 0);
    free(buf);
    return 0;
}
