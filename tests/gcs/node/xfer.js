// xfer: uploads or downloads one object with Google's official Node.js
// client (@google-cloud/storage), for test_gcs_node.py's cross-checks.
//
//   node xfer.js ENDPOINT upload BUCKET OBJECT FILE CHUNK_SIZE   resumable, in chunks
//   node xfer.js ENDPOINT download BUCKET OBJECT FILE            with crc32c validation
//
// ENDPOINT ("http://127.0.0.1:PORT") is passed as apiEndpoint: with a custom
// endpoint the client sends no credentials, as with Google's emulators.
// (Its reading of STORAGE_EMULATOR_HOST takes the value as the full base URL
// ".../storage/v1", unlike the other clients, so it is not used here.)
// Exits non-zero on failure.
'use strict';

const fs = require('fs');
const {pipeline} = require('stream/promises');
const {Storage} = require('@google-cloud/storage');

async function main() {
  const [endpoint, cmd, bucketName, objectName, file, chunk] = process.argv.slice(2);
  delete process.env.STORAGE_EMULATOR_HOST;
  const storage = new Storage({
    apiEndpoint: endpoint,
    projectId: 'test-project',
    retryOptions: {autoRetry: false},
  });
  const object = storage.bucket(bucketName).file(objectName);
  if (cmd === 'upload') {
    await pipeline(
      fs.createReadStream(file),
      object.createWriteStream({
        resumable: true,
        chunkSize: Number(chunk),
        validation: 'crc32c',
        metadata: {contentType: 'application/x-tar'},
      }),
    );
  } else if (cmd === 'download') {
    await object.download({destination: file, validation: 'crc32c'});
  } else {
    throw new Error(`unknown command ${cmd}`);
  }
}

main().catch((e) => {
  console.error(`xfer: ${e.stack || e}`);
  process.exit(1);
});
