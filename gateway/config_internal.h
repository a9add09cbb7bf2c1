/* config_internal: what the files of the gateway's configuration share
 * (config.c, config_vars.c, config_volumes.c); nothing else includes it.
 * Start-up only. */
#ifndef SBX_GATEWAY_CONFIG_INTERNAL_H
#define SBX_GATEWAY_CONFIG_INTERNAL_H

#include "common/config.h"
#include "common/err.h"
#include "gateway/config.h"

/* How many variables the table has. */
#define GW_CONFIG_N_VARS 67

/* Fills `vars` with the table, each target a field of *c (not read: `c`
 * may be uninitialised). */
void gw_config_vars (gw_config_t *c, cfg_var_t vars[GW_CONFIG_N_VARS]);

/* SANDBOX_VOLUME_MOUNTS into c->volumes (owned by *c, freed by
 * gw_config_release); c->rootfs must be set. */
int gw_config_parse_volumes (gw_config_t *c, err_t *err);

#endif
