# ruff: noqa: E501 (a table of regular expressions reads best unwrapped)
"""Rule lists of the local backend: terms and regular expressions per category.

The built-in list below is a starting point written for this service; staff add their own
in admin (`moderation.Rule`) and sites add theirs in `settings.MODERATION_RULES`. Patterns
match the normalised text (lower case) and its de-obfuscated form (common digit-for-letter
swaps undone, so "k1ll" is "kill"); a term matches whole words only, so "Scunthorpe" is not an insult.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .categories import Category

_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "@": "a", "$": "s"})
_INVISIBLE = re.compile("[\u200b-\u200f\u2060\ufeff]")
_SPACES = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Lower case, invisible characters dropped, spaces collapsed."""
    return _SPACES.sub(" ", _INVISIBLE.sub("", text.lower()))


def deobfuscate(normalised: str) -> str:
    """`normalised` with digit-for-letter swaps undone ("k1ll" is "kill"); rules match both,
    since the swap would also spoil real numbers ("12 year old")."""
    return normalised.translate(_LEET)


@dataclass(frozen=True)
class CompiledRule:
    category: str
    pattern: re.Pattern[str]
    score: float
    source: str  # "builtin", "settings" or "rule:<id>"


def compile_rule(
    *, category: str, kind: str, pattern: str, score: float, source: str
) -> CompiledRule:
    """A rule ready to match; raises `re.error` for a bad regular expression."""
    if kind == "term":
        words = [re.escape(word) for word in normalise(pattern).split()]
        regex = r"\b" + r"\s+".join(words) + r"\b"
    else:
        regex = pattern
    return CompiledRule(category, re.compile(regex, re.IGNORECASE), score, source)


# Who a violent act is aimed at: a person, not a process, a weed or a show.
_PERSON = (
    r"(?:(?:my|his|her|their|a|an|the|some|this|that|our|your)\s+)?"
    r"(?:neighbou?r|wife|husband|ex|ex-wife|ex-husband|boss|teacher|coworker|co-worker|family|"
    r"child|kid|baby|person|someone|somebody|people|him|her|them|classmates?|mom|mother|dad|"
    r"father|brother|sister|girlfriend|boyfriend|partner|wife's|president|cop|officer)\b"
)
_GROUPS = (
    r"(?:immigrants|refugees|jews|jewish people|muslims|christians|black people|blacks|"
    r"white people|whites|asians|arabs|mexicans|gays|gay people|lesbians|trans people|"
    r"transgender people|women|hindus|sikhs|gypsies|roma|africans|latinos|hispanics|"
    r"chinese people|indians|disabled people|homosexuals)"
)
_MINOR = (
    r"(?:\d{1,2}[- ]?(?:year|yr)s?[- ]?old|minors?|child|children|kids?|underage|preteens?|"
    r"toddlers?|little (?:girl|boy)s?)"
)
_SEXUAL = r"(?:sexual|sexy|erotic|explicit|naked|nude|porn\w*)"

# (category, kind, pattern, score)
BUILTIN_RULES: list[tuple[str, str, str, float]] = [
    # S1 Violent Crimes
    (
        Category.VIOLENT_CRIMES,
        "regex",
        r"\b(?:kill|murder|poison|strangl|stab|shoot|behead|tortur|kidnap|abduct)\w*\s+" + _PERSON,
        0.9,
    ),
    (
        Category.VIOLENT_CRIMES,
        "regex",
        r"\bi(?:'m| am)?\s*(?:will|going to|gonna)\s+(?:kill|murder|shoot|stab|hurt|rape)\s+"
        r"(?:you|u|him|her|them|everyone)\b",
        1.0,
    ),
    (
        Category.VIOLENT_CRIMES,
        "regex",
        r"\bshoot(?:ing)?\s+up\s+(?:my|the|a|our)\s+(?:school|church|mosque|synagogue|mall|office|class)",
        1.0,
    ),
    (Category.VIOLENT_CRIMES, "regex", r"\bhit\s?-?m[ae]n\b", 0.9),
    (
        Category.VIOLENT_CRIMES,
        "regex",
        r"\b(?:plan|carry out|organi[sz]e|commit|help)\w*\b.{0,30}\b(?:terror\w* attack|mass shooting|"
        r"massacre)",
        1.0,
    ),
    (Category.VIOLENT_CRIMES, "regex", r"\bi know where you live\b", 0.9),
    # S2 Non-Violent Crimes
    (Category.NON_VIOLENT_CRIMES, "regex", r"\blaunder\w*\s+(?:money|cash|funds)", 0.9),
    (Category.NON_VIOLENT_CRIMES, "regex", r"\bhot-?wir\w*\b.{0,30}\b(?:car|vehicle|truck)", 0.9),
    (
        Category.NON_VIOLENT_CRIMES,
        "regex",
        r"\b(?:write|create|make|build|draft)\w*\b.{0,20}\bphishing\b",
        0.9,
    ),
    (
        Category.NON_VIOLENT_CRIMES,
        "regex",
        r"\b(?:cook|make|synthes\w+|produce|brew)\w*\s+(?:meth|methamphetamine|crack cocaine|heroin|"
        r"fentanyl|lsd|mdma)\b",
        1.0,
    ),
    (Category.NON_VIOLENT_CRIMES, "regex", r"\bstolen (?:credit )?card(?: number)?s?\b", 0.9),
    (
        Category.NON_VIOLENT_CRIMES,
        "regex",
        r"\b(?:write|create|make|build|develop|code)\w*\b.{0,30}\b(?:ransomware|malware|keylogger|"
        r"trojan|botnet)\b",
        1.0,
    ),
    (Category.NON_VIOLENT_CRIMES, "term", "shoplift", 0.9),
    (Category.NON_VIOLENT_CRIMES, "term", "shoplifting", 0.9),
    (
        Category.NON_VIOLENT_CRIMES,
        "regex",
        r"\bwithout (?:getting caught|being caught|being traced|leaving (?:any )?evidence)",
        0.6,
    ),
    (
        Category.NON_VIOLENT_CRIMES,
        "regex",
        r"\b(?:make|print|produce)\w*\s+counterfeit\b|\bcounterfeit (?:money|bills|currency|notes)",
        0.9,
    ),
    (
        Category.NON_VIOLENT_CRIMES,
        "regex",
        r"\b(?:brute[- ]?forc|hack|crack|break)\w*\b.{0,40}\b(?:someone'?s?|my ex'?s?|his|her|their|"
        r"girlfriend'?s?|boyfriend'?s?|wife'?s?|husband'?s?)\b.{0,30}\b(?:password|account|email|"
        r"instagram|facebook|phone)",
        0.9,
    ),
    (
        Category.NON_VIOLENT_CRIMES,
        "regex",
        r"\b(?:evade|evading|dodge)\s+(?:paying\s+)?taxes\b|\bhid(?:e|ing)\s+income\b.{0,30}\billegal",
        0.9,
    ),
    (
        Category.NON_VIOLENT_CRIMES,
        "regex",
        r"\bbreak\w*\s+into\s+(?:a|the|my neighbou?r'?s?|someone'?s?|their)\s*(?:house|home|"
        r"apartment|car|building)",
        0.9,
    ),
    # S3 Sex-Related Crimes
    (
        Category.SEX_RELATED_CRIMES,
        "regex",
        r"\b(?:secretly|hidden cameras?)\b.{0,30}\b(?:film|record|photograph)\w*\b.{0,30}"
        r"\b(?:women|girls|people|changing rooms?|showers?|bathrooms?)",
        1.0,
    ),
    (
        Category.SEX_RELATED_CRIMES,
        "regex",
        r"\bdrug\s+(?:someone|somebody|her|him|a (?:girl|woman|man)|my date)(?:'s)?\b|"
        r"\bspike\w*\s+(?:a|her|his|someone'?s)?\s*drink",
        1.0,
    ),
    (
        Category.SEX_RELATED_CRIMES,
        "regex",
        r"\btraffic\w*\b.{0,30}\b(?:girls|women|children|kids|people)\b.{0,40}\b(?:sex|prostitution)",
        1.0,
    ),
    (
        Category.SEX_RELATED_CRIMES,
        "regex",
        r"\b(?:force|forcing|coerce|pressure)\w*\b.{0,30}\b(?:to have sex|into sex|sex with)",
        1.0,
    ),
    # S4 Child Sexual Exploitation
    (
        Category.CHILD_SEXUAL_EXPLOITATION,
        "regex",
        r"\b" + _SEXUAL + r"\b.{0,50}\b" + _MINOR + r"\b",
        1.0,
    ),
    (
        Category.CHILD_SEXUAL_EXPLOITATION,
        "regex",
        r"\b" + _MINOR + r"\b.{0,40}\b" + _SEXUAL + r"\b",
        1.0,
    ),
    (Category.CHILD_SEXUAL_EXPLOITATION, "regex", r"\bchild\s*porn\w*|\bcsam\b", 1.0),
    (
        Category.CHILD_SEXUAL_EXPLOITATION,
        "regex",
        r"\bgroom\w*\s+(?:a\s+)?(?:child|kid|minor|children|boy|girl|teen)",
        1.0,
    ),
    # S5 Defamation
    (
        Category.DEFAMATION,
        "regex",
        r"\b(?:fake|false|made[- ]up)\b.{0,30}\b(?:story|article|news|rumou?r|review)s?\b.{0,60}"
        r"\b(?:steal\w*|fraud|pedophile|rapist|criminal|cheat\w*|affair)",
        0.9,
    ),
    (
        Category.DEFAMATION,
        "regex",
        r"\b(?:claim\w*|saying|says|accus\w*)\b.{0,60}\bis an? (?:convicted )?(?:pedophile|rapist|"
        r"murderer|criminal|fraud)\b",
        0.85,
    ),
    # S6 Specialized Advice
    (
        Category.SPECIALIZED_ADVICE,
        "regex",
        r"\b(?:oxycodone|oxy|xanax|fentanyl|adderall|percocet|opioids?)\b.{0,40}\b(?:to get high|"
        r"get high|without a prescription)",
        0.9,
    ),
    (
        Category.SPECIALIZED_ADVICE,
        "regex",
        r"\b(?:not|don'?t|instead of) (?:to )?(?:go(?:ing)? )?to (?:the )?(?:hospital|doctor|er)\b",
        0.85,
    ),
    # S7 Privacy
    (
        Category.PRIVACY,
        "regex",
        r"\b(?:find|get|give me|look up|what is)\b.{0,20}\b(?:home|house|private|personal) "
        r"(?:address|phone number)",
        0.9,
    ),
    (Category.PRIVACY, "regex", r"\bsocial security number of\b|\bssn of\b", 0.9),
    (
        Category.PRIVACY,
        "regex",
        r"\btrack\w*\b.{0,30}\b(?:girlfriend|boyfriend|wife|husband|partner|ex|someone)'?s?\b.{0,20}"
        r"\b(?:phone|location|car)\b.{0,40}\bwithout\b",
        0.9,
    ),
    (Category.PRIVACY, "regex", r"\bdox\w*\b", 0.9),
    # S8 Intellectual Property
    (
        Category.INTELLECTUAL_PROPERTY,
        "regex",
        r"\b(?:crack\w*|pirat\w*|free)\b.{0,20}\b(?:license|licence|serial|activation|product) keys?\b|"
        r"\bkeygen\b",
        0.9,
    ),
    (
        Category.INTELLECTUAL_PROPERTY,
        "regex",
        r"\bpirated\b|\btorrent\w* (?:of )?the (?:new|full)",
        0.85,
    ),
    (
        Category.INTELLECTUAL_PROPERTY,
        "regex",
        r"\b(?:reproduce|print|give me|write out|copy)\b.{0,20}\b(?:the )?(?:entire|whole|full|"
        r"complete) (?:text|book|lyrics|chapter|script)\b",
        0.85,
    ),
    # S9 Indiscriminate Weapons
    (
        Category.INDISCRIMINATE_WEAPONS,
        "regex",
        r"\b(?:make|making|build|building|construct\w*|assembl\w*|creat\w*)\b.{0,40}"
        r"\b(?:bombs?|explosives?|ieds?|detonators?|napalm|grenades?|molotov)\b",
        1.0,
    ),
    (
        Category.INDISCRIMINATE_WEAPONS,
        "regex",
        r"\b(?:pipe|nail|fertili[sz]er|dirty)\s*bombs?\b",
        0.9,
    ),
    (
        Category.INDISCRIMINATE_WEAPONS,
        "regex",
        r"\b(?:synthes\w*|make|produce|weaponi[sz]\w*|culture|release|spread)\b.{0,60}\b(?:sarin|"
        r"nerve agents?|ricin|anthrax|smallpox|novichok|bioweapons?|chemical weapons?|vx)\b",
        1.0,
    ),
    (
        Category.INDISCRIMINATE_WEAPONS,
        "regex",
        r"\b(?:sarin|nerve agents?|ricin|novichok)\b.{0,40}\b(?:synthes\w*|route|recipe|release)",
        1.0,
    ),
    (
        Category.INDISCRIMINATE_WEAPONS,
        "regex",
        r"\benrich\w*\s+uranium\b.{0,60}\b(?:weapon|bomb|garage|home)|\b(?:build|make)\b.{0,30}"
        r"\bnuclear (?:weapon|bomb)",
        1.0,
    ),
    (
        Category.INDISCRIMINATE_WEAPONS,
        "regex",
        r"\b(?:toxic|poison\w*|deadly|lethal)\s+(?:gas|fumes)\b.{0,40}\b(?:kill|hurt|harm|murder)",
        1.0,
    ),
    # S10 Hate
    (
        Category.HATE,
        "regex",
        r"\b" + _GROUPS + r"\b.{0,60}\b(?:are|is)\b.{0,20}\b(?:vermin|animals|subhuman|inferior|"
        r"a disease|parasites|cockroaches|rats|not human|filth|scum|savages)\b",
        1.0,
    ),
    (
        Category.HATE,
        "regex",
        r"\b"
        + _GROUPS
        + r"\b.{0,60}\b(?:should|must|deserve to|need to)\b.{0,25}\b(?:exterminated|"
        r"wiped out|killed|gassed|eradicated|beaten|burn|die)\b",
        1.0,
    ),
    # S11 Suicide & Self-Harm
    (Category.SUICIDE_SELF_HARM, "regex", r"\b(?:kill|hurt|harm|cut|starve|hang)\s+myself\b", 1.0),
    (Category.SUICIDE_SELF_HARM, "regex", r"\b(?:end|take)\s+my\s+(?:own\s+)?life\b", 1.0),
    (Category.SUICIDE_SELF_HARM, "regex", r"\bcommit(?:ting)?\s+suicide\b", 0.9),
    (
        Category.SUICIDE_SELF_HARM,
        "regex",
        r"\b(?:painless|easiest|quickest|best|fastest)\s+(?:way|method)s?\s+to\s+(?:die|kill myself|"
        r"end (?:my|it))",
        1.0,
    ),
    (
        Category.SUICIDE_SELF_HARM,
        "regex",
        r"\bhow (?:many|much)\b.{0,40}\b(?:pills|tablets|tylenol|paracetamol|insulin)\b.{0,30}"
        r"\b(?:to die|to kill|overdose|lethal|fatal)",
        1.0,
    ),
    (
        Category.SUICIDE_SELF_HARM,
        "regex",
        r"\bjump off\b.{0,30}\b(?:and die|to die|to kill myself)|\b(?:high|tall) enough to "
        r"(?:jump|die)",
        1.0,
    ),
    (Category.SUICIDE_SELF_HARM, "regex", r"\bi(?:'m| am)?\b.{0,15}\bwant to die\b", 0.9),
    (Category.SUICIDE_SELF_HARM, "regex", r"\bkill\s+yourself\b|\bkys\b", 0.9),
    # S12 Sexual Content
    (
        Category.SEXUAL_CONTENT,
        "regex",
        r"\b(?:explicit|graphic|hardcore)\b.{0,30}\b(?:sex|sexual|erotic|porn\w*)\b",
        0.9,
    ),
    (Category.SEXUAL_CONTENT, "regex", r"\bporn\w*\b", 0.85),
    (Category.SEXUAL_CONTENT, "regex", r"\b(?:send|show)\s+(?:me\s+)?(?:your\s+)?nudes\b", 1.0),
    (
        Category.SEXUAL_CONTENT,
        "regex",
        r"\berotic\w*\b.{0,40}\b(?:explicit|genitals?|graphic)\b|\bexplicit\b.{0,40}\bgenitals?\b",
        0.9,
    ),
    # S13 Elections
    (
        Category.ELECTIONS,
        "regex",
        r"\b(?:tell\w*|message|messages|posts?|texts?|write)\b.{0,40}\b(?:voters|democrats|"
        r"republicans|people)\b.{0,60}\b(?:was moved|were moved|is moved|postponed|cancell?ed|"
        r"vote by (?:text|phone|email)|can vote online)",
        1.0,
    ),
    (
        Category.ELECTIONS,
        "regex",
        r"\bpolling (?:stations?|places?) (?:are|is) closed\b|\bkeep\s+voters\s+(?:home|away)",
        0.9,
    ),
    (
        Category.ELECTIONS,
        "regex",
        r"\b(?:fake|forged|fraudulent)\s+ballots?\b|\bstuff\w*\s+(?:the\s+)?ballot\s+box",
        1.0,
    ),
    # S14 Code Interpreter Abuse
    (Category.CODE_INTERPRETER_ABUSE, "regex", r"\brm\s+-rf\s+/(?:\s|$|\*)", 0.9),
    (
        Category.CODE_INTERPRETER_ABUSE,
        "regex",
        r"\b(?:open|spawn|start|create|run)\w*\b.{0,20}\breverse shell",
        1.0,
    ),
    (
        Category.CODE_INTERPRETER_ABUSE,
        "regex",
        r"\b(?:cat|read|print|open)\b.{0,20}/etc/(?:passwd|shadow)",
        0.9,
    ),
    (
        Category.CODE_INTERPRETER_ABUSE,
        "regex",
        r"\b(?:escape|break out of)\b.{0,20}\b(?:the\s+)?(?:sandbox|container)",
        0.9,
    ),
    (
        Category.CODE_INTERPRETER_ABUSE,
        "regex",
        r"\b(?:execute|run|launch)\w*\b.{0,10}\b(?:a\s+)?fork bomb",
        1.0,
    ),
    (
        Category.CODE_INTERPRETER_ABUSE,
        "regex",
        r"\bignore (?:all |your |previous |the |any )*(?:instructions|rules)\b",
        0.6,
    ),
    # Harassment
    (Category.HARASSMENT, "regex", r"\b(?:fuck|screw)\s+(?:you|u)\b|\bgo\s+fuck\s+yourself\b", 1.0),
    (Category.HARASSMENT, "regex", r"\bkill\s+yourself\b|\bkys\b", 1.0),
    (
        Category.HARASSMENT,
        "regex",
        r"\b(?:you|u)(?:'re| are| r)?\s+(?:\w+\s+){0,2}(?:idiot|moron|loser|retard\w*|bitch|whore|slut|"
        r"cunt|asshole|piece of shit|worthless|pathetic|stupid|dumb|ugly|fat|useless)\b",
        0.95,
    ),
    (Category.HARASSMENT, "regex", r"\bi hope (?:you|u) die\b", 1.0),
    (
        Category.HARASSMENT,
        "regex",
        r"\b(?:write|send|make)\b.{0,20}\b(?:insults|messages|texts)\b.{0,40}\b(?:bully|cry|hurt|"
        r"humiliate|harass)",
        0.9,
    ),
    (Category.HARASSMENT, "regex", r"\bbully\s+(?:a|my|this|the|that)\s+\w+", 0.85),
]
