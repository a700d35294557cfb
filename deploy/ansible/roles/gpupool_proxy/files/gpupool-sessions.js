// gpupool's sessions: what nginx (njs, Debian's libnginx-mod-http-js) checks in an app's answer.
// Loaded by gpupool-sessions.conf (js_import); the app is the tenant's code, so nginx, not the job, drops
// the cookies an app may not set. Plain ES5: njs 0.7 (Debian 12) and later.

// A cookie named gpupool_* (the sessions' grant, the API's web session), with or without a __Host- or
// __Secure- prefix, is gpupool's: an app's would shadow or replace one of gpupool's.
var RESERVED = /^(__host-|__secure-)?gpupool_/;
// A Domain attribute widens a cookie from the app's own origin to its siblings or a parent domain.
var DOMAIN = /;\s*domain\s*(=|;|$)/i;

function tossed(cookie) {
    // The name-value pair; a browser reads "=x=1" and "x" as a cookie without a name, sent back as "x=1", "x".
    var pair = cookie.split(';', 1)[0].replace(/^[\s=]+/, '').toLowerCase();
    return RESERVED.test(pair) || DOMAIN.test(cookie);
}

// js_header_filter of the app's answers: every Set-Cookie that is tossed never reaches the browser.
function app_cookies(r) {
    var cookies = r.headersOut['Set-Cookie'];
    if (!cookies || !cookies.length) {
        return;
    }
    var kept = cookies.filter(function (cookie) { return !tossed(cookie); });
    if (kept.length === cookies.length) {
        return;
    }
    r.warn('gpupool: dropped ' + (cookies.length - kept.length) + ' Set-Cookie of the session app with a Domain attribute or a gpupool_ name');
    if (kept.length) {
        r.headersOut['Set-Cookie'] = kept;
    } else {
        delete r.headersOut['Set-Cookie'];
    }
}

export default {app_cookies: app_cookies};
