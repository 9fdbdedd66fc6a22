// An OpenID provider for the REST catalog tests (tests/support/oidc.rs):
// OAuth2's client credentials grant for one client, RS256-signed JWT
// access tokens for the catalog's audience, with the roles and tenant
// claims a catalog's policies read. It prints each grant and refusal.
//
// usage: node oidc_provider.mjs <port> <client id> <client secret> <audience> <node_modules>
import { generateKeyPairSync } from 'node:crypto';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [port, clientId, clientSecret, audience, modules] = process.argv.slice(2);
const entry = pathToFileURL(join(modules, 'oidc-provider', 'lib', 'index.js'));
const { default: Provider } = await import(entry.href);
const issuer = `http://127.0.0.1:${port}`;
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const key = { ...privateKey.export({ format: 'jwk' }), kid: 'test', alg: 'RS256', use: 'sig' };
const provider = new Provider(issuer, {
  cookies: { keys: ['wal2iceberg-tests'] },
  ttl: { ClientCredentials: 3600 },
  jwks: { keys: [key] },
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
    token_endpoint_auth_method: 'client_secret_post',
  }],
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => audience,
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'catalog',
        audience,
        accessTokenTTL: 3600,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  extraTokenClaims: () => ({ roles: ['admin'], tenant_id: 'default' }),
});
// What a test checks: who got a token, and who was refused.
provider.on('grant.success', (ctx) => console.log(`grant ${ctx.oidc.client?.clientId}`));
provider.on('grant.error', (ctx, error) => console.log(`refused ${ctx.oidc.client?.clientId ?? '-'}: ${error.error}`));
provider.listen(Number(port), '127.0.0.1', () => console.log(`listening ${issuer}`));
