// The conformance suite has no option for request headers: this preload adds the game's bearer token to every
// HTTP request it makes (fetch and undici both go through the global dispatcher).
import { Agent, setGlobalDispatcher } from 'undici';

const token = process.env.MCP_BEARER_TOKEN;
const withToken = (headers) => {
  const value = `Bearer ${token}`;
  if (Array.isArray(headers)) return [...headers, 'authorization', value];
  if (headers && typeof headers[Symbol.iterator] === 'function') return [...[...headers].flat(), 'authorization', value];
  return { ...(headers ?? {}), authorization: value };
};
setGlobalDispatcher(new Agent().compose((dispatch) => (options, handler) => dispatch({ ...options, headers: withToken(options.headers) }, handler)));
