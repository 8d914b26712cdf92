'use strict';
// A kubelet stand-in that knows only the upstream device plugin API v1beta1 (./api.proto).
//
//   node kubelet.js DIR [TIMEOUT_SECONDS]
//
// Serves Registration on DIR/kubelet.sock. When a plugin registers, it dials the plugin back at
// DIR/<endpoint> and calls GetDevicePluginOptions before answering (as the kubelet does), then opens
// ListAndWatch. After the first device list it asks GetPreferredAllocation for one device out of the
// healthy ones, allocates it (with PreStartContainer when the plugin asks for it), prints one JSON line
// to stdout and exits 0. Any failure, or no result within the timeout (20 s), exits 1 with a message.

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const SUPPORTED_VERSIONS = ['v1beta1'];
const RESOURCE_NAME = /^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?\/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;

const dir = process.argv[2];
const timeoutSeconds = Number(process.argv[3] || 20);
if (!dir) {
  process.stderr.write('usage: node kubelet.js DIR [TIMEOUT_SECONDS]\n');
  process.exit(2);
}

const definition = protoLoader.loadSync(path.join(__dirname, 'api.proto'), {
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
});
const api = grpc.loadPackageDefinition(definition).v1beta1;

const server = new grpc.Server();
let plugin = null;
let registered = false;
let done = false;

function fail(message) {
  if (done) return;
  done = true;
  process.stderr.write(`kubelet stand-in: ${message}\n`);
  process.exit(1);
}

function finish(result) {
  if (done) return;
  done = true;
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0));
}

function rpcError(call, err) {
  return `${call} failed: ${err.code === undefined ? '' : grpc.status[err.code] + ': '}${err.details || err.message}`;
}

const timer = setTimeout(() => fail(`no result within ${timeoutSeconds} s`), timeoutSeconds * 1000);
timer.unref();

function deadline(seconds) {
  return new Date(Date.now() + seconds * 1000);
}

function register(call, callback) {
  const request = call.request;
  if (registered) {
    callback({ code: grpc.status.ALREADY_EXISTS, details: 'stand-in accepts one registration' });
    return;
  }
  if (!SUPPORTED_VERSIONS.includes(request.version)) {
    callback({ code: grpc.status.INVALID_ARGUMENT, details: `invalid version ${request.version}` });
    fail(`plugin registered with unsupported version ${JSON.stringify(request.version)}`);
    return;
  }
  if (!RESOURCE_NAME.test(request.resource_name)) {
    callback({ code: grpc.status.INVALID_ARGUMENT, details: `invalid resource name ${request.resource_name}` });
    fail(`plugin registered with invalid resource name ${JSON.stringify(request.resource_name)}`);
    return;
  }
  registered = true;
  const address = 'unix:' + path.join(dir, request.endpoint);
  plugin = new api.DevicePlugin(address, grpc.credentials.createInsecure());
  plugin.waitForReady(deadline(10), (err) => {
    if (err) {
      callback({ code: grpc.status.UNAVAILABLE, details: `cannot dial ${request.endpoint}` });
      return fail(`cannot dial the plugin at ${address}: ${err.message}`);
    }
    plugin.GetDevicePluginOptions({}, { deadline: deadline(10) }, (err2, options) => {
      if (err2) {
        callback({ code: grpc.status.UNAVAILABLE, details: 'GetDevicePluginOptions failed' });
        return fail(rpcError('GetDevicePluginOptions', err2));
      }
      callback(null, {});
      watch(request, options);
    });
  });
}

function watch(request, options) {
  const stream = plugin.ListAndWatch({});
  let first = true;
  stream.on('data', (response) => {
    if (!first) return;
    first = false;
    useDevices(request, options, response.devices).then(finish, (err) => fail(err.message));
  });
  stream.on('error', (err) => fail(rpcError('ListAndWatch', err)));
  stream.on('end', () => fail('ListAndWatch ended before the first list'));
}

function unary(method, message) {
  return new Promise((resolve, reject) => {
    plugin[method](message, { deadline: deadline(10) }, (err, response) => {
      if (err) reject(new Error(rpcError(method, err)));
      else resolve(response);
    });
  });
}

async function useDevices(request, options, devices) {
  const healthyIds = devices.filter((d) => d.health === 'Healthy').map((d) => d.ID);
  if (healthyIds.length === 0) throw new Error('the first device list has no Healthy device');
  let preferred = null;
  if (options.get_preferred_allocation_available) {
    const response = await unary('GetPreferredAllocation', {
      container_requests: [{ available_deviceIDs: healthyIds, must_include_deviceIDs: [], allocation_size: 1 }],
    });
    if (response.container_responses.length !== 1) {
      throw new Error(`GetPreferredAllocation returned ${response.container_responses.length} container responses`);
    }
    preferred = response.container_responses[0].deviceIDs;
  }
  const chosen = preferred && preferred.length > 0 ? preferred : healthyIds.slice(0, 1);
  const allocation = await unary('Allocate', { container_requests: [{ devices_ids: chosen }] });
  if (allocation.container_responses.length !== 1) {
    throw new Error(`Allocate returned ${allocation.container_responses.length} container responses`);
  }
  let preStarted = false;
  if (options.pre_start_required) {
    await unary('PreStartContainer', { devices_ids: chosen });
    preStarted = true;
  }
  const container = allocation.container_responses[0];
  return {
    register: {
      version: request.version,
      endpoint: request.endpoint,
      resource_name: request.resource_name,
      options: request.options,
    },
    options,
    capacity: devices.length,
    healthy: healthyIds.length,
    device_ids: devices.map((d) => d.ID),
    devices: devices.map((d) => ({
      id: d.ID,
      health: d.health,
      numa_nodes: d.topology ? d.topology.nodes.map((n) => n.ID) : [],
    })),
    preferred,
    allocated_ids: chosen,
    pre_start_container: preStarted,
    allocation: {
      devices: container.devices,
      envs: container.envs,
      mounts: container.mounts,
      annotations: container.annotations,
      cdi_devices: container.cdi_devices,
    },
  };
}

const socket = path.join(dir, 'kubelet.sock');
try {
  fs.unlinkSync(socket);
} catch (err) {
  if (err.code !== 'ENOENT') fail(`cannot remove a stale ${socket}: ${err.message}`);
}
server.addService(api.Registration.service, { Register: register });
server.bindAsync('unix:' + socket, grpc.ServerCredentials.createInsecure(), (err) => {
  if (err) return fail(`cannot listen on ${socket}: ${err.message}`);
  process.stderr.write(`kubelet stand-in: listening on ${socket}\n`);
});
