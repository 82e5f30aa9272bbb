// A real OAuth 2.1 / OpenID authorization server for capgate's tests:
// panva's certified oidc-provider, configured as an MCP server's
// authorization server (dynamic registration, PKCE, resource indicators
// with JWT access tokens, refresh tokens, revocation, introspection, and
// RFC 8693 token exchange as a registered grant).
//
// Usage: node server.mjs PORT. It prints "listening ISSUER" once it listens.
// The login and consent pages answer at once for the account named by the
// browser's "test_user" cookie, so a test's HTTP client is the user.
import { createServer } from 'node:http';
import Provider, { errors } from 'oidc-provider';

const port = Number(process.argv[2]);
const issuer = `http://127.0.0.1:${port}`;
const accessTTL = Number(process.env.AS_ACCESS_TTL || 3600);
const EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN_TYPE = 'urn:ietf:params:oauth:token-type:access_token';

const provider = new Provider(issuer, {
  clients: [{
    // The client capgate's own sign-in ([auth.oidc]) and token exchange use.
    client_id: 'capgate-exchange', client_secret: 'exchange-secret-not-for-prod',
    grant_types: ['client_credentials', EXCHANGE], response_types: [], redirect_uris: [],
  }],
  findAccount: async (ctx, id) => ({ accountId: id, claims: async () => ({ sub: id }) }),
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: true },
    revocation: { enabled: true },
    introspection: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (ctx, client, oneOf) => oneOf,
      getResourceServerInfo: async (ctx, resource) => ({
        scope: 'mcp:tools',
        audience: resource,
        accessTokenTTL: accessTTL,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  scopes: ['openid', 'offline_access', 'mcp:tools'],
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  pkce: { required: () => true },
  cookies: { keys: ['capgate-test-only-cookie-key'] },
  interactions: { url: async (ctx, interaction) => `/interaction/${interaction.uid}` },
  ttl: { AccessToken: accessTTL, ClientCredentials: accessTTL },
});

// Token exchange (RFC 8693): a subject token this server issued (its own
// JWT access token, checked by introspection of its signature and expiry)
// becomes a JWT access token for the requested resource, for the same
// account.
provider.registerGrantType(EXCHANGE, async (ctx) => {
  const { oidc } = ctx;
  const { params } = oidc;
  if (params.subject_token_type !== ACCESS_TOKEN_TYPE) {
    throw new errors.InvalidRequest('subject_token_type must be an access token');
  }
  let accountId;
  try {
    const [, payload] = params.subject_token.split('.');
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString());
    const keys = await (await fetch(`${issuer}/jwks`)).json();
    const { jwtVerify, createLocalJWKSet } = await import('jose');
    await jwtVerify(params.subject_token, createLocalJWKSet(keys), { issuer });
    accountId = claims.sub;
  } catch (e) {
    throw new errors.InvalidGrant('subject_token does not verify');
  }
  const resource = params.resource;
  if (!resource) throw new errors.InvalidTarget('resource is required');
  const at = new provider.AccessToken({
    accountId, client: oidc.client, scope: 'mcp:tools',
    resourceServer: new provider.ResourceServer(resource, {
      scope: 'mcp:tools', audience: resource, accessTokenTTL: accessTTL, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } },
    }),
  });
  const value = await at.save();
  ctx.body = {
    access_token: value, issued_token_type: ACCESS_TOKEN_TYPE, token_type: 'Bearer',
    expires_in: at.expiration, scope: 'mcp:tools',
  };
}, ['subject_token', 'subject_token_type', 'resource', 'audience', 'requested_token_type', 'scope']);

// Interactions: log in as the test_user cookie's account and grant what
// the client asked for.
provider.use(async (ctx, next) => {
  const m = ctx.path.match(/^\/interaction\/([^/]+)$/);
  if (!m) return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const user = ctx.cookies.get('test_user');
  if (!user) {
    ctx.status = 400;
    ctx.body = 'no test_user cookie: who is signing in?';
    return;
  }
  let result;
  if (details.prompt.name === 'login') {
    result = { login: { accountId: user } };
  } else {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
    const d = details.prompt.details;
    if (d.missingOIDCScope) grant.addOIDCScope(d.missingOIDCScope.join(' '));
    if (d.missingOIDCClaims) grant.addOIDCClaims(d.missingOIDCClaims);
    for (const [res, scopes] of Object.entries(d.missingResourceScopes || {})) {
      grant.addResourceScope(res, scopes.join(' '));
    }
    result = { consent: { grantId: await grant.save() } };
  }
  await provider.interactionFinished(ctx.req, ctx.res, result, { mergeWithLastSubmission: false });
  ctx.respond = false;
});

createServer(provider.callback()).listen(port, '127.0.0.1', () => {
  console.log(`listening ${issuer}`);
});
