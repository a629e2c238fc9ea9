// Where the packages install DRA mode's pieces, as `check` names them in its fixes: the drop-in that opens the unit's
// sandbox for DRA, the command that links it on a node switched to DRA, and DRA's documentation.
import { dirname } from 'node:path';

/** Where the packages install the DRA drop-in, and where a node switched to DRA links it. */
export const DRA_DROPIN_SOURCE = '/usr/share/gpu-device-plugin/dra.conf';
const DRA_DROPIN_LINK = '/etc/systemd/system/gpu-device-plugin.service.d/dra.conf';
export const LINK_DROPIN =
  `mkdir -p ${dirname(DRA_DROPIN_LINK)} && ln ` +
  `-s ${DRA_DROPIN_SOURCE} ${DRA_DROPIN_LINK} && systemctl daemon-reload`;
export const DRA_DOCS = '/usr/share/doc/gpu-device-plugin/dra/README.md';
